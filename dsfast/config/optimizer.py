"""`optimizer` section: {"type": ..., "params": {...}} with a typed schema per supported type.

DeepSpeed gotcha kept for compatibility: type "Adam" uses decoupled weight decay (AdamW) unless
params.adam_w_mode is false (DeepSpeed's ADAM_W_MODE_DEFAULT is true). `OptimizerConfig.adamw_mode` resolves it.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

from pydantic import Field, field_validator, model_validator

from .base import StrictModel, nested_error, plain_error, validate_sub
from .errors import suggest

# DeepSpeed (and torch.optim) optimizer types dsfast does not implement yet: a clear error, not "unknown".
NOT_YET_SUPPORTED_OPTIMIZERS = {
    "lamb", "onebitadam", "zerooneadam", "onebitlamb", "muadam", "muadamw", "musgd", "muon",
    "rmsprop", "adadelta", "adamax", "nadam", "radam", "asgd", "rprop", "lbfgs", "sparseadam",
}


def _finite_nonneg(name: str, v: float) -> float:
    if not math.isfinite(v) or v < 0:
        raise plain_error(f"{name} must be a finite number >= 0 (got {v!r})")
    return v


class AdamParams(StrictModel):
    lr: float = Field(1e-3, ge=0)
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    bias_correction: bool = True
    amsgrad: bool = False
    adam_w_mode: bool = True        # DeepSpeed default: Adam behaves as AdamW unless this is false
    torch_adam: bool = False        # DeepSpeed: use torch.optim.Adam/AdamW instead of its fused kernels
    # DeepSpeedCPUAdam's knob: false keeps the moments in the master's dtype (fp32 masters: fp32 anyway);
    # bf16.bf16_optimizer_states forces it false, as DeepSpeed 0.19.8 does. Other optimizers ignore it.
    fp32_optimizer_states: Optional[bool] = None

    @field_validator("betas", mode="before")
    @classmethod
    def _two_betas(cls, v):
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            raise plain_error(f"must be a list of two numbers [beta1, beta2] (got {v!r})")
        return v

    @field_validator("betas")
    @classmethod
    def _betas(cls, v):
        for b in v:
            if not (0.0 <= b < 1.0):
                raise plain_error(f"each beta must be in [0, 1) (got {list(v)})")
        return v

    @field_validator("lr", "eps", "weight_decay")
    @classmethod
    def _finite(cls, v, info):
        return _finite_nonneg(info.field_name, v)

    @field_validator("amsgrad")
    @classmethod
    def _no_amsgrad(cls, v):
        if v:
            raise plain_error("amsgrad is not supported by dsfast's Adam (nor by DeepSpeed's FusedAdam); "
                              "remove it or set it to false")
        return v


class SGDParams(StrictModel):
    lr: float = Field(1e-3, ge=0)
    momentum: float = Field(0.0, ge=0)
    dampening: float = Field(0.0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    nesterov: bool = False
    maximize: bool = False

    @field_validator("lr", "momentum", "dampening", "weight_decay")
    @classmethod
    def _finite(cls, v, info):
        return _finite_nonneg(info.field_name, v)

    @model_validator(mode="after")
    def _nesterov(self):
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise plain_error("nesterov momentum needs momentum > 0 and dampening 0 "
                              f"(got momentum={self.momentum:g}, dampening={self.dampening:g})")
        return self


class AdagradParams(StrictModel):
    """DeepSpeed builds DeepSpeedCPUAdagrad under offload, torch.optim.Adagrad otherwise: the keys of both
    (defaults as theirs); the engine refuses a key the chosen class lacks when it is set to something else."""
    lr: float = Field(1e-2, ge=0)
    eps: float = Field(1e-10, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    lr_decay: float = Field(0.0, ge=0)
    initial_accumulator_value: float = Field(0.0, ge=0)
    amsgrad: bool = False
    maximize: bool = False
    fp32_optimizer_states: Optional[bool] = None   # DeepSpeedCPUAdagrad's knob, as AdamParams'

    @field_validator("lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value")
    @classmethod
    def _finite(cls, v, info):
        return _finite_nonneg(info.field_name, v)

    @field_validator("amsgrad")
    @classmethod
    def _no_amsgrad(cls, v):
        if v:
            raise plain_error("amsgrad has no meaning for Adagrad (DeepSpeed accepts and ignores it); remove it")
        return v


class LionParams(StrictModel):
    """DeepSpeedCPULion's arguments and defaults (betas (0.9, 0.999); the Lion paper recommends (0.9, 0.99))."""
    lr: float = Field(1e-3, ge=0)
    betas: Tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0)
    fp32_optimizer_states: Optional[bool] = None

    @field_validator("betas", mode="before")
    @classmethod
    def _two_betas(cls, v):
        return AdamParams._two_betas(v)

    @field_validator("betas")
    @classmethod
    def _betas(cls, v):
        return AdamParams._betas(v)

    @field_validator("lr", "weight_decay")
    @classmethod
    def _finite(cls, v, info):
        return _finite_nonneg(info.field_name, v)


# canonical lower-case type -> params schema
OPTIMIZER_PARAMS = {"adam": AdamParams, "adamw": AdamParams, "sgd": SGDParams, "adagrad": AdagradParams,
                    "lion": LionParams}
SUPPORTED_NAMES = "Adam, AdamW, SGD, Adagrad, Lion"


class OptimizerConfig(StrictModel):
    type: str
    params: Any = None   # validated into the type's schema (AdamParams, SGDParams, ...) by _typed_params
    legacy_fusion: bool = False   # DeepSpeed's old fused fp16 optimizer switch; reported as ignored

    @model_validator(mode="before")
    @classmethod
    def _typed_params(cls, data: Any):
        if not isinstance(data, dict):
            return data
        data = dict(data)
        kind = data.get("type")
        if kind is None:
            raise nested_error([(("type",), f'required key is missing; one of {SUPPORTED_NAMES}')])
        if not isinstance(kind, str):
            raise nested_error([(("type",), f'must be a string such as "AdamW" (got {kind!r})')])
        low = kind.lower()
        if low in NOT_YET_SUPPORTED_OPTIMIZERS:
            raise nested_error([(("type",), f"optimizer type {kind!r} is not supported by dsfast yet; supported: "
                                 f"{SUPPORTED_NAMES} (or pass your own torch.optim optimizer to "
                                 "dsfast.initialize(optimizer=...))")])
        if low not in OPTIMIZER_PARAMS:
            hint = suggest(low, OPTIMIZER_PARAMS)
            raise nested_error([(("type",), f"unknown optimizer type {kind!r}; supported: {SUPPORTED_NAMES}"
                                 + (f"; {hint}" if hint.startswith("did") else ""))])
        params = data.get("params") or {}
        if not isinstance(params, dict):
            raise nested_error([(("params",), f"must be a mapping of parameter names to values (got {params!r})")])
        if "max_grad_norm" in params:
            raise nested_error([(("params", "max_grad_norm"), 'not an optimizer parameter; use the top-level '
                                 '"gradient_clipping" key instead')])
        data["type"] = low
        data["params"] = validate_sub(OPTIMIZER_PARAMS[low], params, prefix=("params",))
        return data

    @property
    def adamw_mode(self) -> bool:
        """Decoupled weight decay? True for AdamW, and for Adam unless params.adam_w_mode is false (DeepSpeed)."""
        if self.type == "adamw":
            return True
        if self.type == "adam":
            return bool(self.params.adam_w_mode)
        return False

    def torch_kwargs(self) -> Dict[str, Any]:
        """Arguments for a torch.optim-style constructor (lr, betas, eps, weight_decay, ...), dsfast flags removed."""
        d = self.params.model_dump()
        for flag in ("adam_w_mode", "torch_adam", "fp32_optimizer_states", "amsgrad"):
            d.pop(flag, None)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return d
