"""Hyperparameter and tensor checks shared by every dsfast optimizer (CPU and CUDA).

Each check raises a ValueError (bad value) or TypeError (bad type) whose message names
the parameter, the value received and what would be valid, so a typo in a config file
is found at construction time instead of as NaNs a thousand steps later.
"""
import math
import numbers

import torch

_GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_HALF_DTYPES = (torch.bfloat16, torch.float16)


def _as_float(name, value):
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise TypeError(f"{name} must be a number or a one-element tensor, got a tensor of shape "
                            f"{tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_lr(lr, name="lr"):
    value = _as_float(name, lr)
    if value < 0.0:
        raise ValueError(f"Invalid learning rate: {name}={value}; it must be >= 0")
    return value


def check_nonnegative(value, name):
    v = _as_float(name, value)
    if v < 0.0:
        raise ValueError(f"Invalid {name}: {v}; it must be >= 0")
    return v


def check_unit_interval(value, name):
    """A decay factor in [0, 1), e.g. one of Adam's betas."""
    v = _as_float(name, value)
    if not 0.0 <= v < 1.0:
        raise ValueError(f"Invalid {name}: {v}; it must be in [0, 1)")
    return v


def check_betas(betas, name="betas"):
    if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
        raise TypeError(f"{name} must be a pair (beta1, beta2), got {betas!r}")
    return (check_unit_interval(betas[0], f"{name}[0] (beta1)"),
            check_unit_interval(betas[1], f"{name}[1] (beta2)"))


def check_eps(eps, name="eps"):
    v = _as_float(name, eps)
    if v <= 0.0:
        raise ValueError(f"Invalid {name}: {v}; it must be > 0 (it keeps the update's denominator away from zero)")
    return v


def check_adam_hparams(lr, betas, eps, weight_decay, amsgrad=False):
    """Validate Adam/AdamW hyperparameters; returns them normalised to floats."""
    lr = check_lr(lr)
    betas = check_betas(betas)
    eps = check_eps(eps)
    weight_decay = check_nonnegative(weight_decay, "weight_decay")
    if amsgrad:
        raise ValueError("amsgrad=True is not supported by dsfast's Adam kernels; use torch.optim.Adam(amsgrad=True) "
                         "or set amsgrad=False")
    return lr, betas, eps, weight_decay


def check_adagrad_hparams(lr, eps, weight_decay, lr_decay=0.0, initial_accumulator_value=0.0):
    """Validate Adagrad hyperparameters (DeepSpeedCPUAdagrad's: torch.optim.Adagrad with lr_decay 0 and
    initial_accumulator_value 0, which a torch state dict may carry); returns (lr, eps, weight_decay) as floats."""
    lr = check_lr(lr)
    eps = check_eps(eps)
    weight_decay = check_nonnegative(weight_decay, "weight_decay")
    for name, value in (("lr_decay", lr_decay), ("initial_accumulator_value", initial_accumulator_value)):
        if _as_float(name, value) != 0.0:
            raise ValueError(f"{name}={value!r} is not supported by DeepSpeedCPUAdagrad (dsfast.optim.CPUAdagrad); "
                             f"it must be 0, or use torch.optim.Adagrad")
    return lr, eps, weight_decay


def check_lion_hparams(lr, betas, weight_decay):
    """Validate Lion hyperparameters; returns (lr, (beta1, beta2), weight_decay) as floats."""
    return check_lr(lr), check_betas(betas), check_nonnegative(weight_decay, "weight_decay")


def check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov):
    """Validate SGD hyperparameters with torch.optim.SGD's rules; returns them normalised."""
    lr = check_lr(lr)
    momentum = check_nonnegative(momentum, "momentum")
    dampening = _as_float("dampening", dampening)
    weight_decay = check_nonnegative(weight_decay, "weight_decay")
    if not isinstance(nesterov, bool):
        raise TypeError(f"nesterov must be a bool, got {nesterov!r}")
    if nesterov and (momentum <= 0.0 or dampening != 0.0):
        raise ValueError(f"nesterov=True requires momentum > 0 and dampening == 0, got momentum={momentum}, "
                         f"dampening={dampening}")
    return lr, momentum, dampening, weight_decay, nesterov


def check_unsupported_flags(group, flags):
    """Reject torch.optim options that a kernel does not implement, instead of ignoring them."""
    for key in flags:
        if group.get(key):
            raise ValueError(f"{key}={group[key]!r} is not supported by this optimizer; remove it or use torch.optim")


def param_name(index, group_index):
    return f"param_groups[{group_index}]['params'][{index}]"


def check_param(p, where, device_type):
    """A parameter the kernel updates in place: fp32, on `device_type`, contiguous."""
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{where} must be a torch.Tensor, got {type(p).__name__}")
    if p.device.type != device_type:
        raise ValueError(f"{where} is on device {p.device}, but this optimizer updates {device_type} tensors; "
                         f"move the model to {device_type} or use the matching optimizer")
    if p.dtype != torch.float32:
        raise TypeError(f"{where} has dtype {p.dtype}; this optimizer keeps fp32 parameters (torch.float32)")
    if not p.is_contiguous():
        raise ValueError(f"{where} is not contiguous (shape {tuple(p.shape)}, stride {p.stride()}); "
                         f"updating a contiguous copy would silently lose the update. Call .contiguous() "
                         f"on the parameter's data before building the optimizer")


def check_grad(p, g, where):
    """A gradient read by the kernel: same shape and device as its parameter, fp32/bf16/fp16, contiguous."""
    if g.shape != p.shape:
        raise ValueError(f"{where}.grad has shape {tuple(g.shape)} but the parameter has shape {tuple(p.shape)}")
    if g.device != p.device:
        raise ValueError(f"{where}.grad is on {g.device} but the parameter is on {p.device}")
    if g.dtype not in _GRAD_DTYPES:
        raise TypeError(f"{where}.grad has dtype {g.dtype}; supported gradient dtypes are float32, bfloat16, float16")
    if g.is_sparse:
        raise TypeError(f"{where}.grad is sparse; dsfast optimizers need dense gradients")
    if not g.is_contiguous():
        raise ValueError(f"{where}.grad is not contiguous (stride {g.stride()}); the kernel reads gradients in "
                         f"place and will not copy them")


def check_half_out(p, out, where):
    """An optional 16-bit buffer receiving the updated parameter (the offload path's fused copy)."""
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{where} output buffer must be a torch.Tensor or None, got {type(out).__name__}")
    if out.dtype not in _HALF_DTYPES:
        raise TypeError(f"{where} output buffer has dtype {out.dtype}; it must be torch.bfloat16 or torch.float16")
    if out.numel() != p.numel():
        raise ValueError(f"{where} output buffer has {out.numel()} elements but the parameter has {p.numel()}")
    if out.device != p.device:
        raise ValueError(f"{where} output buffer is on {out.device} but the parameter is on {p.device}")
    if not out.is_contiguous():
        raise ValueError(f"{where} output buffer is not contiguous (stride {out.stride()})")


def check_state(p, state_tensor, key, where):
    """An optimizer state tensor (e.g. loaded from a state dict) the kernel writes in place."""
    if not isinstance(state_tensor, torch.Tensor):
        raise TypeError(f"{where} state[{key!r}] must be a tensor, got {type(state_tensor).__name__}")
    if state_tensor.shape != p.shape or state_tensor.dtype != torch.float32 or state_tensor.device != p.device \
            or not state_tensor.is_contiguous():
        raise ValueError(f"{where} state[{key!r}] must be a contiguous float32 tensor of shape {tuple(p.shape)} on "
                         f"{p.device}; got shape {tuple(state_tensor.shape)}, dtype {state_tensor.dtype}, "
                         f"device {state_tensor.device}, contiguous={state_tensor.is_contiguous()}")


def check_adam_group(group):
    """A param group's validated Adam hyperparameters (lr, betas, eps, weight_decay); refuses the torch flags a CPU
    kernel cannot honour (CPUAdam, CPUAdam8bit)."""
    hparams = check_adam_hparams(group["lr"], group["betas"], group["eps"], group["weight_decay"],
                                 group.get("amsgrad", False))
    check_unsupported_flags(group, ("foreach", "fused", "capturable", "differentiable"))
    return hparams
