"""DeepSpeed's LR schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest)."""
from .base import LRSchedule
from .build import SCHEDULES, build_lr_scheduler
from .one_cycle import LRRangeTest, OneCycle
from .warmup import WarmupCosineLR, WarmupDecayLR, WarmupLR

__all__ = ["build_lr_scheduler", "SCHEDULES", "LRSchedule", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
           "OneCycle", "LRRangeTest"]
