"""OneCycle (1cycle policy, DeepSpeed's parameters and formulas) and LRRangeTest.

OneCycle, for i = t + 1 within the cycle (t < total = first + second step sizes):
  x = 1 + i/total - floor(1 + i/total);  scale = x/r on the way up (x <= r = first/total), else (x-1)/(r-1);
  with stairs: scale = floor(position * stairs) / stairs.  lr = min + (max - min) * scale;
  momentum (beta1) = max_mom - (max_mom - min_mom) * scale.
After the cycle (t >= total), with decay enabled (decay_step_size and the rate non-zero):
  lr = min_lr / (1 + decay_lr_rate * (t - total + 1) / decay_step_size), beta1 = max_mom * (1 + decay_mom_rate * ...).
Difference from DeepSpeed: when cycling momentum we keep each group's beta2; DeepSpeed overwrites it with 0.99.
"""
from __future__ import annotations

import logging
import math
from typing import List, Optional, Tuple, Union

from dsfast.config.scheduler import LRRangeTestParams, OneCycleParams

from .base import LRSchedule, per_group, validated, write_lr
from .warmup import ctor_args

logger = logging.getLogger("dsfast.schedulers")

LrArg = Union[float, List[float]]


class OneCycle(LRSchedule):
    def __init__(self, optimizer, cycle_min_lr: LrArg, cycle_max_lr: LrArg, decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000, cycle_second_step_size: Optional[int] = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: Optional[int] = None,
                 decay_step_size: int = 0, cycle_momentum: bool = True, cycle_min_mom: LrArg = 0.8,
                 cycle_max_mom: LrArg = 0.9, decay_mom_rate: float = 0.0, last_batch_iteration: int = -1):
        p = validated(OneCycleParams, ctor_args(locals()), "OneCycle")
        super().__init__(optimizer, p.last_batch_iteration)
        groups = self.param_groups
        self.first_step_size = float(p.cycle_first_step_size)
        self.second_step_size = (float(p.cycle_second_step_size) if p.cycle_second_step_size is not None
                                 else self.first_step_size)
        self.total_size = self.first_step_size + self.second_step_size
        self.step_ratio = self.first_step_size / self.total_size
        self.first_stair_count = p.cycle_first_stair_count
        self.second_stair_count = (p.cycle_first_stair_count if p.cycle_second_stair_count is None
                                   else p.cycle_second_stair_count)
        self.decay_step_size = p.decay_step_size
        self.decay_lr_rate = p.decay_lr_rate
        self.decay_mom_rate = p.decay_mom_rate
        self.skip_lr_decay = self.decay_step_size == 0 or self.decay_lr_rate == 0
        self.skip_mom_decay = self.decay_step_size == 0 or self.decay_mom_rate == 0
        self.min_lrs = per_group(groups, p.cycle_min_lr, "cycle_min_lr")
        self.max_lrs = per_group(groups, p.cycle_max_lr, "cycle_max_lr")
        self.cycle_momentum = p.cycle_momentum
        if self.cycle_momentum and not all("betas" in g for g in groups):
            logger.warning("OneCycle: cycle_momentum is disabled because %s has no 'betas' (as in DeepSpeed, "
                           "only Adam-style beta1 is cycled)", type(optimizer).__name__)
            self.cycle_momentum = False
        if self.cycle_momentum:
            self.min_moms = per_group(groups, p.cycle_min_mom, "cycle_min_mom")
            self.max_moms = per_group(groups, p.cycle_max_mom, "cycle_max_mom")
            self.beta2s = [float(g["betas"][1]) for g in groups]
        if self.last_batch_iteration == -1:
            # DeepSpeed starts at the low end of both ranges.
            self._last_lr = write_lr(groups, self.min_lrs)
            if self.cycle_momentum:
                self._write_betas(self.min_moms)

    def _scale_factor(self) -> float:
        i = self.last_batch_iteration + 1
        cycle = math.floor(1 + i / self.total_size)
        x = 1.0 + i / self.total_size - cycle
        if x <= self.step_ratio:
            scale, stairs = x / self.step_ratio, self.first_stair_count
        else:
            scale, stairs = (x - 1) / (self.step_ratio - 1), self.second_stair_count
        if stairs > 0:
            pos_in_cycle = i % self.total_size
            if pos_in_cycle <= self.first_step_size:
                position = pos_in_cycle * stairs / self.first_step_size
            else:
                position = (self.total_size - pos_in_cycle) * stairs / self.second_step_size
            scale = math.floor(position) / stairs
        return scale

    def get_lr(self) -> List[float]:
        t = self.last_batch_iteration
        if t < self.total_size:
            s = self._scale_factor()
            return [lo + (hi - lo) * s for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1 + self.decay_lr_rate * (t - self.total_size + 1) / self.decay_step_size
        return [lo / factor for lo in self.min_lrs]

    def get_mom(self) -> Optional[List[Tuple[float, float]]]:
        """(beta1, beta2) per group, or None when momentum is not cycled."""
        if not self.cycle_momentum:
            return None
        t = self.last_batch_iteration
        if t < self.total_size:
            s = self._scale_factor()
            beta1 = [hi - (hi - lo) * s for lo, hi in zip(self.min_moms, self.max_moms)]
        elif self.skip_mom_decay:
            beta1 = list(self.max_moms)
        else:
            factor = 1 + self.decay_mom_rate * (t - self.total_size + 1) / self.decay_step_size
            beta1 = [hi * factor for hi in self.max_moms]
        return list(zip(beta1, self.beta2s))

    def _write_betas(self, beta1s: List[float]) -> None:
        for g, b1, b2 in zip(self.param_groups, beta1s, self.beta2s):
            g["betas"] = (b1, b2)

    def _apply(self) -> None:
        super()._apply()
        moms = self.get_mom()
        if moms is not None:
            self._write_betas([b1 for b1, _ in moms])


class LRRangeTest(LRSchedule):
    """lr = lr_range_test_min_lr * (1 + step_rate * interval), interval = (t + 1) / step_size (floored when
    staircase): a sweep to find the largest lr that still trains."""

    def __init__(self, optimizer, lr_range_test_min_lr: LrArg = 1e-3, lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1):
        p = validated(LRRangeTestParams, ctor_args(locals()), "LRRangeTest")
        super().__init__(optimizer, p.last_batch_iteration)
        self.min_lrs = per_group(self.param_groups, p.lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size = p.lr_range_test_step_size
        self.step_rate = p.lr_range_test_step_rate
        self.staircase = p.lr_range_test_staircase
        if self.last_batch_iteration == -1:
            self._last_lr = write_lr(self.param_groups, self.min_lrs)

    def _interval(self) -> float:
        ratio = (self.last_batch_iteration + 1) / self.step_size
        return float(math.floor(ratio)) if self.staircase else ratio

    def get_lr(self) -> List[float]:
        increase = 1 + self.step_rate * self._interval()
        return [lo * increase for lo in self.min_lrs]
