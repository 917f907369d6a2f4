"""`scheduler` section: {"type": ..., "params": {...}}; one params schema per DeepSpeed schedule.

Defaults follow DeepSpeed 0.19 lr_schedules.py. Values that DeepSpeed allows per parameter group
(warmup_min_lr, cycle_min_lr, ...) may be a number or a list with one number per group.
"""
from __future__ import annotations

import warnings
from typing import Any, List, Optional, Union

from pydantic import Field, field_validator, model_validator

from .base import StrictModel, nested_error, plain_error, validate_sub
from .errors import suggest

LrValue = Union[float, List[float]]


def _warmup_type(v):
    # DeepSpeed 0.19.8 warns and warms up on the log curve for any other value (its comparison is exact, so
    # "Linear" is log too); dsfast does the same, so that a config gives the same learning rates on both.
    if v in ("log", "linear"):
        return v
    hint = ' (did you mean "linear"?)' if isinstance(v, str) and v.lower() == "linear" else ""
    warnings.warn(f'scheduler warmup_type {v!r} is not "log" or "linear"{hint}: the log warmup is used, as '
                  "DeepSpeed 0.19.8 does", UserWarning, stacklevel=2)
    return "log"


def _nonneg(v, name):
    values = v if isinstance(v, list) else [v]
    if any(x < 0 for x in values):
        raise plain_error(f"{name} must be >= 0 (got {v!r})")
    return v


class _SchedParams(StrictModel):
    last_batch_iteration: int = Field(-1, ge=-1)   # -1: start from the beginning


class WarmupLRParams(_SchedParams):
    warmup_min_lr: LrValue = 0.0
    warmup_max_lr: Optional[LrValue] = None     # None: the optimizer's lr (DeepSpeed >= 0.17; earlier 0.001)
    warmup_num_steps: int = Field(1000, ge=1)   # values below 2 act as 2 (log warmup divides by ln N)
    warmup_type: str = "log"

    @field_validator("warmup_type", mode="before")
    @classmethod
    def _wt(cls, v):
        return _warmup_type(v)

    @field_validator("warmup_min_lr", "warmup_max_lr")
    @classmethod
    def _lr(cls, v, info):
        return v if v is None else _nonneg(v, info.field_name)


class WarmupDecayLRParams(WarmupLRParams):
    total_num_steps: int = Field(ge=1)          # required
    warmup_max_lr: Optional[LrValue] = 0.001    # DeepSpeed keeps 0.001 here


class WarmupCosineLRParams(_SchedParams):
    total_num_steps: int = Field(ge=1)          # required
    warmup_min_ratio: float = Field(0.0, ge=0.0, le=1.0)
    warmup_num_steps: int = Field(1000, ge=1)
    cos_min_ratio: float = Field(0.0001, ge=0.0, le=1.0)
    warmup_type: str = "log"

    @field_validator("warmup_type", mode="before")
    @classmethod
    def _wt(cls, v):
        return _warmup_type(v)


class OneCycleParams(_SchedParams):
    cycle_min_lr: LrValue                       # required
    cycle_max_lr: LrValue                       # required
    decay_lr_rate: float = Field(0.0, ge=0.0)
    cycle_first_step_size: int = Field(2000, ge=1)
    cycle_second_step_size: Optional[int] = Field(None, ge=0)   # None: same as the first
    cycle_first_stair_count: int = Field(0, ge=0)
    cycle_second_stair_count: Optional[int] = Field(None, ge=0)  # None: same as the first
    decay_step_size: int = Field(0, ge=0)
    cycle_momentum: bool = True
    cycle_min_mom: LrValue = 0.8
    cycle_max_mom: LrValue = 0.9
    decay_mom_rate: float = Field(0.0, ge=0.0)

    @field_validator("cycle_min_lr", "cycle_max_lr", "cycle_min_mom", "cycle_max_mom")
    @classmethod
    def _lr(cls, v, info):
        return _nonneg(v, info.field_name)

    @model_validator(mode="after")
    def _second_stairs(self):
        if self.cycle_second_step_size == 0 and (self.cycle_second_stair_count or 0) > 0:
            raise plain_error("cycle_second_stair_count > 0 needs cycle_second_step_size > 0")
        return self


class LRRangeTestParams(_SchedParams):
    lr_range_test_min_lr: LrValue = 1e-3
    lr_range_test_step_size: int = Field(2000, ge=1)
    lr_range_test_step_rate: float = Field(1.0, ge=0.0)
    lr_range_test_staircase: bool = False

    @field_validator("lr_range_test_min_lr")
    @classmethod
    def _lr(cls, v, info):
        return _nonneg(v, info.field_name)


# canonical type name -> params schema
SCHEDULER_PARAMS = {
    "WarmupLR": WarmupLRParams,
    "WarmupDecayLR": WarmupDecayLRParams,
    "WarmupCosineLR": WarmupCosineLRParams,
    "OneCycle": OneCycleParams,
    "LRRangeTest": LRRangeTestParams,
}
_BY_LOWER = {k.lower(): k for k in SCHEDULER_PARAMS}


class SchedulerConfig(StrictModel):
    type: str
    params: Any = None   # validated into the type's schema by _typed_params

    @model_validator(mode="before")
    @classmethod
    def _typed_params(cls, data: Any):
        if not isinstance(data, dict):
            return data
        data = dict(data)
        kind = data.get("type")
        valid = ", ".join(SCHEDULER_PARAMS)
        if not isinstance(kind, str):
            msg = "required key is missing" if kind is None else f"must be a string (got {kind!r})"
            raise nested_error([(("type",), f"{msg}; one of {valid}")])
        canonical = _BY_LOWER.get(kind.lower())
        if canonical is None:
            hint = suggest(kind, SCHEDULER_PARAMS)
            raise nested_error([(("type",), f"scheduler type {kind!r} is not supported by dsfast; supported: {valid}"
                                 + (f"; {hint}" if hint.startswith("did") else "")
                                 + " (or pass your own scheduler object to dsfast.initialize(lr_scheduler=...))")])
        params = data.get("params") or {}
        if not isinstance(params, dict):
            raise nested_error([(("params",), f"must be a mapping of parameter names to values (got {params!r})")])
        data["type"] = canonical
        data["params"] = validate_sub(SCHEDULER_PARAMS[canonical], params, prefix=("params",))
        return data
