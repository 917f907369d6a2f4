"""Loss scalers with DeepSpeed's semantics (Megatron-LM lineage), pure Python, no tensors.

The engine detects overflow (fused kernels on GPU, reference ops on CPU), skips the step when there was one,
and calls `update_scale(overflow)` once per optimizer step. Scalers only decide the next scale.

DynamicLossScaler, per call:
  overflow:  if hysteresis == 1 or cur_hysteresis == 1: halve (never below min_scale; already at the floor ->
             LossScaleUnderflowError), else cur_hysteresis -= 1 and keep the scale. last_overflow_iter = cur_iter.
  clean:     consecutive_hysteresis -> refill cur_hysteresis now. If (cur_iter - last_overflow_iter) is a multiple
             of scale_window: refill cur_hysteresis (when not consecutive) and double the scale.
  cur_iter += 1 on every call.
So the scale doubles after `scale_window` clean steps in a row, counted from the last overflow (or the start).
(DeepSpeed 0.19.8 waits one step longer, stable_interval = cur_iter - last_overflow_iter - 1; we keep the
documented rule, "scale_window consecutive clean iterations", which DeepSpeed followed up to 0.17.)
"""
from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

logger = logging.getLogger("dsfast.precision")

HISTORY = 16   # overflowing steps kept for the underflow error message


class LossScaleUnderflowError(RuntimeError):
    """fp16 gradients overflowed again while the dynamic loss scale was already at its floor."""


def _rank() -> int:
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:  # noqa: BLE001 - torch absent or half-initialized: fall back to the environment
        pass
    return int(os.environ.get("RANK", "0") or 0)


class LossScalerBase:
    dynamic = False

    def __init__(self, scale: float):
        self.cur_scale = float(scale)
        self.cur_iter = 0
        self.overflow_count = 0

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    @property
    def inv_scale(self) -> float:
        return 1.0 / self.cur_scale

    def scale_loss(self, loss):
        return loss * self.cur_scale

    def update_scale(self, overflow: bool, step: Optional[int] = None) -> None:
        if overflow:
            self.overflow_count += 1
            if _rank() == 0:
                logger.info("[dsfast] OVERFLOW! Skipping step %s: gradients are not finite (loss scale %g "
                            "kept)", self.cur_iter if step is None else step, self.cur_scale)
        self.cur_iter += 1

    def state_dict(self) -> Dict[str, Any]:
        return {"cur_scale": self.cur_scale, "cur_iter": self.cur_iter, "overflow_count": self.overflow_count}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.cur_iter = int(state.get("cur_iter", 0))
        self.overflow_count = int(state.get("overflow_count", 0))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(loss_scale={self.cur_scale:g})"


class NoOpLossScaler(LossScalerBase):
    """bf16 and fp32: scale 1. An overflow (non-finite gradients) still skips the step and is logged."""

    def __init__(self):
        super().__init__(1.0)


class StaticLossScaler(LossScalerBase):
    """fp16 with "loss_scale" > 0: a fixed scale; overflowing steps are skipped, the scale never changes."""

    def __init__(self, scale: float):
        if not scale > 0:
            raise ValueError(f"a static loss scale must be > 0 (got {scale!r}); 0 selects dynamic scaling")
        super().__init__(scale)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        # The configured static scale wins over the checkpoint's: the user may have changed it.
        super().load_state_dict(state)


class DynamicLossScaler(LossScalerBase):
    """fp16 dynamic loss scale: halve on overflow (after `hysteresis` overflows), double after `scale_window`
    clean steps, never below `min_scale`.

    Defaults are the documented ds_config ones (2**16, hysteresis 2) whatever the ZeRO stage, as DeepSpeed 0.19.8's
    engine passes them (older DeepSpeed releases' ZeRO path used 2**32 and hysteresis 1 when the fp16 section named
    no dynamic-scale key). Deliberate difference: the scale doubles after `scale_window` overflow-free steps, as
    DeepSpeed documents; DeepSpeed 0.19.8 doubles one step later (tests/test_deepspeed_defaults.py, recorded).
    """

    dynamic = True

    def __init__(self, init_scale: float = 2.0 ** 16, scale_factor: float = 2.0, scale_window: int = 1000,
                 min_scale: float = 1.0, hysteresis: int = 2, consecutive_hysteresis: bool = False,
                 raise_error_at_min_scale: bool = True):
        if not init_scale > 0 or not min_scale > 0:
            raise ValueError(f"init_scale and min_scale must be > 0 (got {init_scale!r}, {min_scale!r})")
        if scale_factor <= 1:
            raise ValueError(f"scale_factor must be > 1 (got {scale_factor!r})")
        if scale_window < 1 or hysteresis < 1:
            raise ValueError(f"scale_window and hysteresis must be >= 1 (got {scale_window!r}, {hysteresis!r})")
        super().__init__(init_scale)
        self.scale_factor = float(scale_factor)
        self.scale_window = int(scale_window)
        self.min_scale = float(min_scale)
        self.hysteresis = int(hysteresis)          # DeepSpeed calls this delayed_shift
        self.cur_hysteresis = int(hysteresis)
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        self.raise_error_at_min_scale = bool(raise_error_at_min_scale)
        self.last_overflow_iter = -1
        self.overflow_history: Deque[Tuple[int, float]] = deque(maxlen=HISTORY)   # (step, attempted scale)

    def update_scale(self, overflow: bool, step: Optional[int] = None) -> None:
        label = self.cur_iter if step is None else step
        if overflow:
            self.overflow_count += 1
            self.overflow_history.append((label, self.cur_scale))
            if self.hysteresis == 1 or self.cur_hysteresis == 1:
                if self.cur_scale <= self.min_scale and self.raise_error_at_min_scale:
                    raise LossScaleUnderflowError(self._underflow_message(label))
                new_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
                if _rank() == 0:
                    logger.info("[dsfast] OVERFLOW! Skipping step %s. Attempted loss scale: %g, reducing to %g",
                                label, self.cur_scale, new_scale)
                self.cur_scale = new_scale
            else:
                if _rank() == 0:
                    logger.info("[dsfast] OVERFLOW! Skipping step %s. Attempted loss scale: %g, kept "
                                "(hysteresis %d -> %d)", label, self.cur_scale, self.cur_hysteresis,
                                self.cur_hysteresis - 1)
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.hysteresis
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.hysteresis
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1

    def _underflow_message(self, step) -> str:
        recent = ", ".join(f"{s} (scale {sc:g})" for s, sc in self.overflow_history)
        return (f"fp16 gradients overflowed at step {step} while the dynamic loss scale was already at its floor "
                f"min_loss_scale={self.min_scale:g}: the gradients are inf/NaN even unscaled, so training cannot "
                f"continue. Recent overflowing steps: {recent}. The model has most likely diverged or exceeds "
                'fp16\'s range: use bf16 ("bf16": {"enabled": true}) if the hardware has it, lower the learning '
                'rate, or set "gradient_clipping"; check the data for inf/NaN.')

    @property
    def recent_overflows(self) -> List[int]:
        return [s for s, _ in self.overflow_history]

    def state_dict(self) -> Dict[str, Any]:
        sd = super().state_dict()
        sd.update(cur_hysteresis=self.cur_hysteresis, last_overflow_iter=self.last_overflow_iter,
                  overflow_history=[list(x) for x in self.overflow_history],
                  # configuration, for inspection; load_state_dict keeps the current config's values
                  scale_factor=self.scale_factor, scale_window=self.scale_window, min_scale=self.min_scale,
                  hysteresis=self.hysteresis, consecutive_hysteresis=self.consecutive_hysteresis)
        return sd

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.cur_scale = max(float(state["cur_scale"]), self.min_scale)
        self.cur_hysteresis = min(int(state.get("cur_hysteresis", self.hysteresis)), self.hysteresis)
        self.last_overflow_iter = int(state.get("last_overflow_iter", -1))
        self.overflow_history.clear()
        for s, sc in state.get("overflow_history", []):
            self.overflow_history.append((s, float(sc)))

    def __repr__(self) -> str:
        return (f"DynamicLossScaler(loss_scale={self.cur_scale:g}, window={self.scale_window}, "
                f"hysteresis={self.cur_hysteresis}/{self.hysteresis}, min={self.min_scale:g})")


def build_loss_scaler(fp16_cfg: Any = None) -> LossScalerBase:
    """The scaler for a config: None / fp16 disabled -> NoOp; loss_scale > 0 -> Static; else Dynamic.

    Accepts an Fp16Config, a plain `fp16` dict, a DsConfig, or None.
    """
    if fp16_cfg is None:
        return NoOpLossScaler()
    from dsfast.config import DsConfig, Fp16Config
    if isinstance(fp16_cfg, DsConfig):
        fp16_cfg = fp16_cfg.fp16
    if isinstance(fp16_cfg, dict):
        from dsfast.config.base import translate
        from dsfast.config.errors import DsConfigError, dotted, format_problems
        from pydantic import ValidationError
        try:
            fp16_cfg = Fp16Config.model_validate(fp16_cfg)
        except ValidationError as err:
            probs = [(dotted(("fp16",) + loc), msg) for loc, msg in translate(err, Fp16Config)]
            raise DsConfigError(format_problems(probs, None), probs) from None
    if not isinstance(fp16_cfg, Fp16Config):
        raise TypeError(f"build_loss_scaler expects an fp16 config (Fp16Config, dict, DsConfig) or None, "
                        f"got {type(fp16_cfg).__name__}")
    if not fp16_cfg.enabled:
        return NoOpLossScaler()
    if not fp16_cfg.dynamic:
        return StaticLossScaler(fp16_cfg.loss_scale)
    return DynamicLossScaler(init_scale=fp16_cfg.initial_scale, scale_window=fp16_cfg.loss_scale_window,
                             min_scale=fp16_cfg.min_loss_scale, hysteresis=fp16_cfg.hysteresis,
                             consecutive_hysteresis=fp16_cfg.consecutive_hysteresis)
