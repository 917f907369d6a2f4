"""deepspeed.runtime.lr_schedules: the LR schedules, for programs that build them by hand (dsfast.schedulers)."""
from ..schedulers import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

# the names a config's "scheduler.type" may take (programs test `type(sched).__name__ in VALID_LR_SCHEDULES`)
VALID_LR_SCHEDULES = ["LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]

__all__ = ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest", "VALID_LR_SCHEDULES"]
