"""deepspeed.runtime.lr_schedules: the LR schedules, for programs that build them by hand (dsfast.schedulers)."""
from ..schedulers import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

__all__ = ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"]
