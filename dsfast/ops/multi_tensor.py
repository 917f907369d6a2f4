"""Loss-scaling and gradient-norm functions over many tensors, for the engine and optimizers.

CUDA tensors go to the `cuda_optim` op (one launch per ~hundreds of tensors, nothing read
back to the host); other tensors go to the pure-torch reference.portable_multi_tensor. Every function accepts
tensors of mixed dtypes and groups them itself.

    found_inf = torch.zeros((), device=dev)
    unscale_and_check_(grads, inv_scale, found_inf)          # grads *= inv_scale, flag inf/nan
    total, per = l2_norm(grads, per_tensor=True)
    total, coef = grad_norm_and_clip_coef(grads, max_norm=1.0, inv_scale=inv, found_inf=found_inf)
    clip_grads_(grads, max_norm=1.0)                          # torch.nn.utils.clip_grad_norm_
"""
from collections import OrderedDict

import torch

OP_NAME = "cuda_optim"


def backend(device):
    """The module implementing the op for tensors on `device` (native on CUDA when buildable)."""
    if torch.device(device).type == "cuda":
        from . import load
        return load(OP_NAME)
    from .reference import portable_multi_tensor
    return portable_multi_tensor


def _check_tensor_list(name, tensors):
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{name} must be a list of tensors, got a single tensor; wrap it in a list")
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
    return tensors


def scalar_tensor(name, t, device):
    """A one-element float32 tensor on `device` (moved without a host sync when needed)."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or t.numel() != 1:
        raise TypeError(f"{name} must be a one-element tensor, got {t!r}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype}")
    return t if t.device == torch.device(device) else t.to(device, non_blocking=True)


def _flag(name, t, device):
    """found_inf must be updated in place, so it has to live on the tensors' device already."""
    if t is None:
        return None
    t2 = scalar_tensor(name, t, device)
    if t2 is not t:
        raise ValueError(f"{name} is on {t.device} but the tensors are on {device}; allocate it there "
                         f"(e.g. torch.zeros((), device={str(device)!r}))")
    return t


def group_by_device_dtype(tensors):
    """OrderedDict (device, dtype) -> list of indices, in first-seen order."""
    groups = OrderedDict()
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    return groups


def unscale_and_check_(grads, inv_scale, found_inf):
    """grads *= inv_scale in place and set found_inf to 1 if any gradient is inf or nan.

    inv_scale, found_inf: one-element float32 tensors on the grads' device; found_inf is only
    ever raised, so one flag can collect several calls. Like
    torch._amp_foreach_non_finite_check_and_unscale_, without a host sync."""
    grads = _check_tensor_list("grads", grads)
    for (device, _), idx in group_by_device_dtype(grads).items():
        backend(device).unscale_and_check_([grads[i] for i in idx], scalar_tensor("inv_scale", inv_scale, device),
                                           _flag("found_inf", found_inf, device))


def _norm_groups(tensors, per_tensor, inv_scale, found_inf, max_norm):
    tensors = _check_tensor_list("tensors", tensors)
    if not tensors:
        raise ValueError("l2_norm needs at least one tensor")
    groups = group_by_device_dtype(tensors)
    device = tensors[0].device
    if len(groups) == 1:  # the common case: one fused pass writes everything
        return backend(device).l2_norm(tensors, per_tensor, scalar_tensor("inv_scale", inv_scale, device),
                                       _flag("found_inf", found_inf, device), float(max_norm))
    totals, per = [], [None] * len(tensors)
    for (dev, _), idx in groups.items():
        t, p, _ = backend(dev).l2_norm([tensors[i] for i in idx], per_tensor,
                                       scalar_tensor("inv_scale", inv_scale, dev),
                                       _flag("found_inf", found_inf, dev) if dev == device else None, 0.0)
        totals.append(t.to(device, non_blocking=True))
        for k, i in enumerate(idx):
            if per_tensor:
                per[i] = p[k].to(device, non_blocking=True)
    total = torch.linalg.vector_norm(torch.stack(totals))
    if found_inf is not None:
        found_inf.copy_(torch.maximum(found_inf, (~torch.isfinite(total)).float()))
    clip = torch.clamp(max_norm / (total + 1e-6), max=1.0) if max_norm > 0 else torch.empty(0, device=device)
    return total, (torch.stack(per) if per_tensor else torch.empty(0, device=device)), clip


def l2_norm(tensors, per_tensor=False):
    """(total, per_tensor): the L2 norm of all tensors together (fp32 accumulation, a 0-dim
    float32 tensor on the first tensor's device) and, when per_tensor, a 1-D tensor of each
    tensor's norm (else None). Matches torch.linalg.vector_norm of the concatenation."""
    total, per, _ = _norm_groups(tensors, per_tensor, None, None, 0.0)
    return total, (per if per_tensor else None)


def grad_norm_and_clip_coef(grads, max_norm, inv_scale=None, found_inf=None):
    """One read of the (possibly loss-scaled) gradients gives, all on the device:
    total = ||grads|| * inv_scale (the true gradient norm), found_inf raised when it is not
    finite, and coef = min(1, max_norm / (total + 1e-6)), the factor clip_grad_norm_ applies.
    Pass coef as clip_coef (and inv_scale, found_inf) to FusedAdam/FusedSGD.step to unscale,
    clip and skip inside the optimizer kernel. Returns (total, coef)."""
    if not float(max_norm) > 0.0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    total, _, coef = _norm_groups(grads, False, inv_scale, found_inf, float(max_norm))
    return total, coef


def clip_grads_(grads, max_norm, found_inf=None):
    """torch.nn.utils.clip_grad_norm_ for a list of gradient tensors: scales them in place by
    min(1, max_norm / (norm + 1e-6)) and returns the total norm (no host sync)."""
    grads = _check_tensor_list("grads", grads)
    total, coef = grad_norm_and_clip_coef(grads, max_norm, found_inf=found_inf)
    for (device, _), idx in group_by_device_dtype(grads).items():
        torch._foreach_mul_([grads[i] for i in idx], coef.to(device, non_blocking=True))
    return total
