"""build_lr_scheduler: the ds_config "scheduler" section -> a schedule bound to the optimizer."""
from __future__ import annotations

from typing import Any, Optional

from pydantic import ValidationError

from dsfast.config.base import translate
from dsfast.config.errors import DsConfigError, dotted, format_problems
from dsfast.config.scheduler import SchedulerConfig

from .one_cycle import LRRangeTest, OneCycle
from .warmup import WarmupCosineLR, WarmupDecayLR, WarmupLR

SCHEDULES = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR,
             "OneCycle": OneCycle, "LRRangeTest": LRRangeTest}


def build_lr_scheduler(scheduler_cfg: Any, optimizer) -> Optional[Any]:
    """None -> None; a SchedulerConfig, or a {"type", "params"} dict, -> the schedule on `optimizer`.

    Construction writes the schedule's starting lr into the optimizer (DeepSpeed semantics)."""
    if scheduler_cfg is None:
        return None
    if hasattr(scheduler_cfg, "scheduler") and not isinstance(scheduler_cfg, (dict, SchedulerConfig)):
        scheduler_cfg = scheduler_cfg.scheduler      # a whole DsConfig
        if scheduler_cfg is None:
            return None
    if isinstance(scheduler_cfg, dict):
        try:
            scheduler_cfg = SchedulerConfig.model_validate(scheduler_cfg)
        except ValidationError as err:
            probs = [(dotted(("scheduler",) + loc), msg) for loc, msg in translate(err, SchedulerConfig)]
            raise DsConfigError(format_problems(probs, None), probs) from None
    if not isinstance(scheduler_cfg, SchedulerConfig):
        raise TypeError(f"build_lr_scheduler expects a scheduler config (dict or SchedulerConfig) or None, got "
                        f"{type(scheduler_cfg).__name__}")
    cls = SCHEDULES[scheduler_cfg.type]
    return cls(optimizer, **scheduler_cfg.params.model_dump())
