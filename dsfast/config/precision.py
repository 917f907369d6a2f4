"""`fp16`, `bf16` (alias `bfloat16`) and `amp` sections. Defaults are DeepSpeed's documented ones."""
from __future__ import annotations

import math
from typing import List, Optional

from pydantic import ConfigDict, Field, field_validator, model_validator

from .base import StrictModel, nested_error, plain_error


class Fp16Config(StrictModel):
    enabled: bool = False
    auto_cast: bool = False                       # cast floating-point inputs of forward() to fp16
    loss_scale: float = Field(0.0, ge=0)          # 0 = dynamic loss scaling; > 0 = static scale
    initial_scale_power: int = Field(16, ge=0, le=63)   # dynamic: first scale is 2**initial_scale_power
    # loss_scale_window and min_loss_scale are checked only where they are used (fp16 on, dynamic scale), as in
    # DeepSpeed 0.19.8, which accepts any value in a static or disabled fp16 section
    loss_scale_window: int = 1000                 # clean steps before the scale doubles
    hysteresis: int = Field(2, ge=1)              # overflows tolerated before the scale halves
    consecutive_hysteresis: bool = False          # refill hysteresis after every clean step
    min_loss_scale: float = 1.0                   # floor of the dynamic scale
    fp16_master_weights_and_grads: bool = False   # fp16 masters (ZeRO 1-3 + offload_optimizer + CPUAdam)

    @field_validator("loss_scale")
    @classmethod
    def _finite(cls, v):
        if not math.isfinite(v):
            raise plain_error(f"must be a finite number; 0 means dynamic loss scaling (got {v!r})")
        return v

    @model_validator(mode="after")
    def _dynamic_scale_settings(self):
        if not (self.enabled and self.dynamic):
            return self
        problems = []
        if self.loss_scale_window < 1:
            problems.append((("loss_scale_window",), f"must be >= 1 with dynamic loss scaling (fp16 enabled, "
                                                     f"loss_scale 0); got {self.loss_scale_window}"))
        if not (math.isfinite(self.min_loss_scale) and self.min_loss_scale > 0):
            problems.append((("min_loss_scale",), f"must be a finite number > 0 with dynamic loss scaling (fp16 "
                                                  f"enabled, loss_scale 0); got {self.min_loss_scale!r}"))
        if problems:
            raise nested_error(problems)
        if self.min_loss_scale > self.initial_scale:
            raise nested_error([(("min_loss_scale",), f"{self.min_loss_scale:g} is above the initial dynamic scale "
                                 f"2**initial_scale_power = {self.initial_scale:g}; lower min_loss_scale or "
                                 "raise initial_scale_power")])
        return self

    @property
    def dynamic(self) -> bool:
        return self.loss_scale == 0

    @property
    def initial_scale(self) -> float:
        return float(2 ** self.initial_scale_power)


class Bf16Config(StrictModel):
    enabled: bool = False
    immediate_grad_update: bool = False   # DeepSpeed's bf16 ZeRO optimizer knob; no effect at stage 0
    check_grad_overflow: bool = True      # DeepSpeed 0.19: skip a bf16 step whose gradients are not finite
    # bf16 masters (and gradient shards) at ZeRO 1-3; bf16 Adam moments too (needs the former). Where they are
    # accepted with which offload and optimizer: config/master_precision.py
    bf16_master_weights_and_grads: bool = False
    bf16_optimizer_states: bool = False

    def ignored(self) -> List[str]:
        out = []
        if self.enabled and self.immediate_grad_update:
            out.append("bf16.immediate_grad_update has no effect without ZeRO partitioning")
        return out


class AmpConfig(StrictModel):
    """apex AMP. Its other keys are apex arguments (opt_level, ...), passed through by DeepSpeed."""
    model_config = ConfigDict(extra="allow")
    enabled: bool = False

    @field_validator("enabled")
    @classmethod
    def _no_apex(cls, v):
        if v:
            raise plain_error('apex AMP is not supported by dsfast; use "fp16": {"enabled": true} or '
                              '"bf16": {"enabled": true} instead')
        return v


# torch_autocast.dtype spellings DeepSpeed accepts (its DtypeEnum), for the two dtypes autocast computes in
_AUTOCAST_DTYPES = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
                    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16"}
_FULL_PRECISION = ("fp32", "float32", "float", "torch.float32")


class TorchAutocastConfig(StrictModel):
    """DeepSpeed 0.19's `torch_autocast`: forward under torch.autocast, fp32 weights (see dsfast.engine.autocast).

    dtype None means torch's default for the device (float16 on CUDA, bfloat16 on the CPU).
    lower_precision_safe_modules: classes ("torch.nn.Linear") whose gradients ZeRO 1-3 may reduce in `dtype`;
    None is DeepSpeed's default list (Linear, Conv1d/2d/3d). At stage 0 it changes no numbers, in DeepSpeed too.
    """
    enabled: bool = False
    dtype: Optional[str] = None
    lower_precision_safe_modules: Optional[List[str]] = None

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype(cls, v):
        if v is None:
            return None
        text = str(v).lower()          # torch.bfloat16 (a dtype in a Python dict config) reads "torch.bfloat16"
        if text in _AUTOCAST_DTYPES:
            return _AUTOCAST_DTYPES[text]
        if text in _FULL_PRECISION:
            raise plain_error(f"{v!r}: autocast computes in a lower precision, so it takes \"bf16\" or \"fp16\"; "
                              "for fp32 training set torch_autocast.enabled to false")
        raise plain_error(f'must be "bf16" (bfloat16) or "fp16" (float16) (got {v!r})')

    @field_validator("lower_precision_safe_modules", mode="before")
    @classmethod
    def _module_names(cls, v):
        if v is None:
            return None
        if not isinstance(v, list):
            raise plain_error(f'must be a list of class names such as ["torch.nn.Linear"] (got {v!r})')
        bad = [((i,), f'must be a class name with its module, such as "torch.nn.Linear" (got {name!r})')
               for i, name in enumerate(v)
               if not isinstance(name, str) or "." not in name.strip(".") or " " in name]
        if bad:
            raise nested_error(bad)
        return v
