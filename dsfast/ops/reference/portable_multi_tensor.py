"""The multi-tensor ops (adam_, sgd_, unscale_and_check_, l2_norm) in pure torch, for tensors on
any device: the implementation FusedAdam/FusedSGD and dsfast.ops.multi_tensor use for every
non-CUDA tensor (on CPU this IS the implementation, not a fallback), and the stand-in for the
`cuda_optim` op when it cannot be built (same functions, arguments and results).

Math follows csrc/include/dsfast/optim_math.h step by step in fp32, so it is also the parity
reference for the GPU tests. Unlike the kernels it may read device scalars back to the host
(found_inf), which is fine for a fallback.
"""
import math

import torch

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_lists(op, params, **lists):
    n = len(params)
    for name, ts in lists.items():
        if ts is not None and len(ts) != n:
            raise RuntimeError(f"dsfast {op}: got {len(ts)} {name} for {n} params; every list must have one "
                               f"entry per param")
    for name, ts in dict(params=params, **lists).items():
        for i, t in enumerate(ts or ()):
            if t.dtype not in _DTYPES:
                raise TypeError(f"dsfast {op}: {name}[{i}] has dtype {t.dtype}; the kernels take float32, float16 "
                                f"or bfloat16")
            if not t.is_contiguous():
                raise RuntimeError(f"dsfast {op}: {name}[{i}] is not contiguous (strides {t.stride()}); the "
                                   f"kernel works in place on dense memory")
            if t.numel() != params[i].numel():
                raise RuntimeError(f"dsfast {op}: {name}[{i}] has {t.numel()} elements but its parameter has "
                                   f"{params[i].numel()}")


def _grad_multiplier(inv_scale, clip_coef, maximize):
    scale = 1.0
    if inv_scale is not None:
        scale = inv_scale.float()
    if clip_coef is not None:
        scale = clip_coef.float() * scale
    if maximize:
        scale = -scale
    return scale


def _skipped(found_inf):
    return found_inf is not None and float(found_inf) != 0.0


def adam_(grads, params, exp_avgs, exp_avg_sqs, steps, model_copies, lr, beta1, beta2, eps, weight_decay,
          adamw, bias_correction, inv_scale=None, clip_coef=None, found_inf=None, maximize=False):
    """Adam/AdamW in place. steps: one-element fp32 tensors, already incremented. model_copies:
    [] or 16-bit tensors receiving the updated (fp32 master) params."""
    _check_lists("adam_", params, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs,
                 model_copies=model_copies or None)
    if len(steps) != len(params):
        raise RuntimeError(f"dsfast adam_: got {len(steps)} steps for {len(params)} params")
    if model_copies and any(p.dtype != torch.float32 for p in params):
        raise TypeError("dsfast adam_: with model_copies the params must be float32 master weights")
    if _skipped(found_inf):
        return
    gmul = _grad_multiplier(inv_scale, clip_coef, maximize)
    f32 = torch.float32

    def r32(x):  # round a Python float to float32, as the kernel's coefficients are
        return float(torch.tensor(x, dtype=f32))

    # make_adam_coeffs: 1 - beta and lr * wd formed in double, then rounded once.
    l2 = 0.0 if adamw else r32(weight_decay)
    decay = float(torch.tensor(1.0, dtype=f32) - r32(lr * weight_decay)) if adamw else 1.0
    one_minus_b1, one_minus_b2 = r32(1.0 - beta1), r32(1.0 - beta2)
    for i, p in enumerate(params):
        step = float(steps[i])
        bc1 = 1.0 - math.pow(beta1, step) if bias_correction else 1.0
        bc2 = 1.0 - math.pow(beta2, step) if bias_correction else 1.0
        step_size = r32(lr / bc1)
        inv_bc2_sqrt = r32(1.0 / math.sqrt(bc2))
        g = grads[i].to(f32) * gmul
        pv = p.to(f32)
        m = exp_avgs[i].to(f32)
        v = exp_avg_sqs[i].to(f32)
        if l2 != 0.0:
            g = g + l2 * pv
        m = m + one_minus_b1 * (g - m)
        v = beta2 * v + one_minus_b2 * g * g
        denom = v.sqrt() * inv_bc2_sqrt + eps
        pv = pv * decay
        pv = pv - step_size * m / denom
        p.copy_(pv)
        exp_avgs[i].copy_(m)
        exp_avg_sqs[i].copy_(v)
        if model_copies:
            model_copies[i].copy_(pv)


def sgd_(grads, params, momentum_buffers, model_copies, lr, momentum, dampening, weight_decay, nesterov, first_step,
         inv_scale=None, clip_coef=None, found_inf=None, maximize=False):
    """SGD in place with torch.optim.SGD semantics; momentum_buffers is [] when momentum == 0."""
    if momentum == 0.0 and momentum_buffers:
        raise RuntimeError("dsfast sgd_: momentum is 0 but momentum_buffers were given")
    _check_lists("sgd_", params, grads=grads, momentum_buffers=momentum_buffers if momentum != 0.0 else None,
                 model_copies=model_copies or None)
    if model_copies and any(p.dtype != torch.float32 for p in params):
        raise TypeError("dsfast sgd_: with model_copies the params must be float32 master weights")
    if _skipped(found_inf):
        return
    gmul = _grad_multiplier(inv_scale, clip_coef, maximize)
    one_minus_damp = float(torch.tensor(1.0 - dampening, dtype=torch.float32))
    f32 = torch.float32
    for i, p in enumerate(params):
        g = grads[i].to(f32) * gmul
        pv = p.to(f32)
        if weight_decay != 0.0:
            g = g + weight_decay * pv
        if momentum != 0.0:
            buf = g if first_step else momentum * momentum_buffers[i].to(f32) + one_minus_damp * g
            momentum_buffers[i].copy_(buf)
            g = g + momentum * buf if nesterov else buf
        pv = pv - lr * g
        p.copy_(pv)
        if model_copies:
            model_copies[i].copy_(pv)


def unscale_and_check_(grads, inv_scale, found_inf):
    """grads *= inv_scale in place; found_inf = 1 when any gradient is inf or nan (never cleared)."""
    if not grads:
        return
    torch._amp_foreach_non_finite_check_and_unscale_(list(grads), found_inf, inv_scale)


def l2_norm(tensors, per_tensor=False, inv_scale=None, found_inf=None, max_norm=0.0):
    """(total, per-tensor norms or an empty tensor, clip coefficient or an empty tensor), fp32.

    total = ||tensors||_2 * inv_scale; found_inf is set when it is not finite; the clip
    coefficient is min(1, max_norm / (total + 1e-6)) as in torch.nn.utils.clip_grad_norm_."""
    if not tensors:
        raise RuntimeError("dsfast l2_norm: empty param list")
    device = tensors[0].device
    norms = torch.stack([torch.linalg.vector_norm(t, dtype=torch.float32) for t in tensors])
    total = torch.linalg.vector_norm(norms)
    if inv_scale is not None:
        norms = norms * inv_scale
        total = total * inv_scale
    if found_inf is not None:
        found_inf.copy_(torch.maximum(found_inf, (~torch.isfinite(total)).to(found_inf.dtype)))
    clip = torch.empty(0, device=device)
    if max_norm > 0.0:
        clip = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    per = norms if per_tensor else torch.empty(0, device=device)
    return total, per, clip
