"""deepspeed.runtime.fp16.loss_scaler: DeepSpeed's loss-scaler API over dsfast's scalers (dsfast.precision).

LossScaler (static), DynamicLossScaler (DeepSpeed's positional signature: init_scale, scale_window, min_scale,
delayed_shift, consecutive_hysteresis, ...) and CreateLossScaler build dsfast's scalers, so they scale, halve and
double as dsfast's engine does. The one difference from DeepSpeed 0.19.8 is dsfast's (README): the scale doubles
after scale_window overflow-free steps, DeepSpeed's one step later.
"""
import torch

from ...precision.loss_scaler import DynamicLossScaler as _DynamicLossScaler
from ...precision.loss_scaler import LossScalerBase, LossScaleUnderflowError  # noqa: F401
from ...precision.loss_scaler import StaticLossScaler as _StaticLossScaler

# the keys of dynamic_loss_args (engine.dynamic_loss_scale_args())
INITIAL_LOSS_SCALE = "init_scale"
SCALE_WINDOW = "scale_window"
DELAYED_SHIFT = "delayed_shift"
CONSECUTIVE_HYSTERESIS = "consecutive_hysteresis"
MIN_LOSS_SCALE = "min_scale"


def to_python_float(t):
    return t.item() if hasattr(t, "item") else t[0]


def _has_inf_or_nan(x):
    return not bool(torch.isfinite(x).all())


class _DeepSpeedMethods:
    """What DeepSpeed's scalers offer beyond dsfast's: scaling a backward, and gradient hooks."""

    def scale_gradient(self, module, grad_in, grad_out):
        return tuple(self.loss_scale * g for g in grad_in)

    def backward(self, loss, retain_graph=False):
        self.scale_loss(loss).backward(retain_graph=retain_graph)


class LossScaler(_DeepSpeedMethods, _StaticLossScaler):
    """A fixed loss scale (1 by default); it never reports an overflow itself."""

    def __init__(self, scale=1):
        super().__init__(scale)

    def has_overflow(self, params):
        return False

    @staticmethod
    def _has_inf_or_nan(x):
        return False


class DynamicLossScaler(_DeepSpeedMethods, _DynamicLossScaler):
    """dsfast's dynamic scaler under DeepSpeed's signature (delayed_shift is dsfast's hysteresis)."""

    def __init__(self, init_scale, scale_window, min_scale, delayed_shift, consecutive_hysteresis,
                 raise_error_at_min_scale=True, dtype=torch.half):
        super().__init__(init_scale=init_scale, scale_window=scale_window, min_scale=min_scale,
                         hysteresis=delayed_shift, consecutive_hysteresis=consecutive_hysteresis,
                         raise_error_at_min_scale=raise_error_at_min_scale)
        self.dtype = dtype

    @property
    def delayed_shift(self):
        return self.hysteresis

    def has_overflow_serial(self, params):
        return any(p.grad is not None and _has_inf_or_nan(p.grad.data) for p in params)

    _has_inf_or_nan = staticmethod(_has_inf_or_nan)


def CreateLossScaler(dtype, static_loss_scale, dynamic_scaling, dynamic_loss_args):
    """fp16 with dynamic scaling: a DynamicLossScaler from dynamic_loss_args (the keys above); otherwise a static
    LossScaler, of static_loss_scale for fp16 and 1 for other dtypes (which are not scaled)."""
    if dtype == torch.half and dynamic_scaling:
        if dynamic_loss_args is None:
            raise ValueError("CreateLossScaler: dynamic loss scaling needs dynamic_loss_args (a dict of "
                             f"{INITIAL_LOSS_SCALE}, {SCALE_WINDOW}, {MIN_LOSS_SCALE}, {DELAYED_SHIFT}, "
                             f"{CONSECUTIVE_HYSTERESIS}; engine.dynamic_loss_scale_args() gives it)")
        return DynamicLossScaler(dtype=dtype, **dynamic_loss_args)
    return LossScaler(scale=static_loss_scale if dtype == torch.half else 1.0)


__all__ = ["LossScalerBase", "LossScaler", "DynamicLossScaler", "CreateLossScaler", "to_python_float",
           "INITIAL_LOSS_SCALE", "SCALE_WINDOW", "DELAYED_SHIFT", "CONSECUTIVE_HYSTERESIS", "MIN_LOSS_SCALE"]
