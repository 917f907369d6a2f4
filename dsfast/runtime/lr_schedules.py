"""deepspeed.runtime.lr_schedules: the LR schedules, for programs that build them by hand (dsfast.schedulers)."""
from ..schedulers import SCHEDULES, LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR

# the names a config's "scheduler.type" may take (programs test `type(sched).__name__ in VALID_LR_SCHEDULES`)
VALID_LR_SCHEDULES = list(SCHEDULES)

__all__ = ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest", "VALID_LR_SCHEDULES"]
