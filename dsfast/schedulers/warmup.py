"""WarmupLR, WarmupDecayLR, WarmupCosineLR (DeepSpeed's parameters, defaults and formulas).

Warmup factor at iteration t < N (N = max(2, warmup_num_steps)):
  log:    ln(t + 1) / ln(N)         linear: t / N          then 1.0 from t = N on.
WarmupDecayLR after warmup: max(0, (T - t) / max(1, T - N)).
WarmupCosineLR after warmup: cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * min(1, (t-N+1)/max(1, T-N)))) / 2,
times the optimizer's lr at construction; during warmup warmup_min_ratio + factor * (1 - warmup_min_ratio).
"""
from __future__ import annotations

import logging
import math
from typing import List, Optional, Union

from dsfast.config.scheduler import WarmupCosineLRParams, WarmupDecayLRParams, WarmupLRParams

from .base import LRSchedule, per_group, validated

logger = logging.getLogger("dsfast.schedulers")

LrArg = Union[float, List[float]]


def ctor_args(local_vars) -> dict:
    """Constructor arguments as a params dict for validation."""
    return {k: v for k, v in local_vars.items() if k not in ("self", "optimizer", "__class__")}


def warmup_factor(t: int, n: int, kind: str) -> float:
    if kind == "log":
        return math.log(t + 1) / math.log(n)
    return t / n


class WarmupLR(LRSchedule):
    """lr rises from warmup_min_lr to warmup_max_lr over warmup_num_steps, then stays there."""

    def __init__(self, optimizer, warmup_min_lr: LrArg = 0.0, warmup_max_lr: Optional[LrArg] = None,
                 warmup_num_steps: int = 1000, warmup_type: str = "log", last_batch_iteration: int = -1):
        p = validated(WarmupLRParams, ctor_args(locals()), type(self).__name__)
        super().__init__(optimizer, p.last_batch_iteration)
        max_lr = p.warmup_max_lr
        if max_lr is None:    # DeepSpeed >= 0.17: the optimizer's own lr
            max_lr = [float(g["lr"]) for g in self.param_groups]
        self.min_lrs = per_group(self.param_groups, p.warmup_min_lr, "warmup_min_lr")
        self.max_lrs = per_group(self.param_groups, max_lr, "warmup_max_lr")
        self.delta_lrs = [hi - lo for hi, lo in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, p.warmup_num_steps)
        self.warmup_type = p.warmup_type
        if self.last_batch_iteration == -1:
            self._apply()

    def _gamma(self) -> float:
        t = self.last_batch_iteration
        if t < self.warmup_num_steps:
            return warmup_factor(t, self.warmup_num_steps, self.warmup_type)
        return 1.0

    def get_lr(self) -> List[float]:
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [lo + d * gamma for lo, d in zip(self.min_lrs, self.delta_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then a linear decay to 0 at total_num_steps."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_lr: LrArg = 0.0,
                 warmup_max_lr: Optional[LrArg] = 0.001, warmup_num_steps: int = 1000, warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        validated(WarmupDecayLRParams, ctor_args(locals()), type(self).__name__)
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)
        if self.total_num_steps < self.warmup_num_steps:
            logger.warning("WarmupDecayLR: total_num_steps %d is less than warmup_num_steps %d",
                           total_num_steps, warmup_num_steps)

    def _gamma(self) -> float:
        t = self.last_batch_iteration
        if t < self.warmup_num_steps:
            return warmup_factor(t, self.warmup_num_steps, self.warmup_type)
        return max(0.0, (self.total_num_steps - t) / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(LRSchedule):
    """Warm up as a ratio of the optimizer's lr, then cosine decay to cos_min_ratio of it at total_num_steps."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0, warmup_num_steps: int = 1000,
                 cos_min_ratio: float = 0.0001, warmup_type: str = "log", last_batch_iteration: int = -1):
        p = validated(WarmupCosineLRParams, ctor_args(locals()), type(self).__name__)
        super().__init__(optimizer, p.last_batch_iteration)
        self.total_num_steps = p.total_num_steps
        self.warmup_min_ratio = p.warmup_min_ratio
        self.warmup_num_steps = max(2, p.warmup_num_steps)
        self.cos_min_ratio = p.cos_min_ratio
        self.warmup_type = p.warmup_type
        if self.total_num_steps < self.warmup_num_steps:
            logger.warning("WarmupCosineLR: total_num_steps %d is less than warmup_num_steps %d",
                           self.total_num_steps, self.warmup_num_steps)
        self.org_lrs = [float(g["lr"]) for g in self.param_groups]
        if self.last_batch_iteration == -1:
            self._apply()

    def get_lr_ratio(self) -> float:
        t = self.last_batch_iteration
        if t < 0:
            return 0.0   # DeepSpeed: the lr is 0 until the first step()
        if t < self.warmup_num_steps:
            f = warmup_factor(t, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + f * (1.0 - self.warmup_min_ratio)
        progress = min(1.0, (t - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps))
        cosine = (1.0 + math.cos(math.pi * progress)) / 2.0
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self) -> List[float]:
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]
