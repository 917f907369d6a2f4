"""The native cuda_optim op (csrc/bindings/cuda_optim.cpp) behind the functions of
dsfast.ops.reference.portable_multi_tensor (adam_, sgd_, unscale_and_check_, l2_norm: same
arguments and results), and the fake implementations for FakeTensor, torch.compile and opcheck."""
import torch

from ._errors import retyped

_adam = torch.ops.dsfast.cuda_adam_.default
_sgd = torch.ops.dsfast.cuda_sgd_.default
_unscale = torch.ops.dsfast.cuda_unscale_and_check_.default
_norm = torch.ops.dsfast.cuda_l2_norm.default


def adam_(grads, params, exp_avgs, exp_avg_sqs, steps, model_copies, lr, beta1, beta2, eps, weight_decay,
          adamw, bias_correction, inv_scale=None, clip_coef=None, found_inf=None, maximize=False):
    try:
        _adam(grads, params, exp_avgs, exp_avg_sqs, steps, model_copies, lr, beta1, beta2, eps, weight_decay,
              adamw, bias_correction, inv_scale, clip_coef, found_inf, maximize)
    except RuntimeError as e:
        raise retyped(e) from None


def sgd_(grads, params, momentum_buffers, model_copies, lr, momentum, dampening, weight_decay, nesterov, first_step,
         inv_scale=None, clip_coef=None, found_inf=None, maximize=False):
    try:
        _sgd(grads, params, momentum_buffers, model_copies, lr, momentum, dampening, weight_decay, nesterov,
             first_step, inv_scale, clip_coef, found_inf, maximize)
    except RuntimeError as e:
        raise retyped(e) from None


def unscale_and_check_(grads, inv_scale, found_inf):
    if not grads:
        return
    try:
        _unscale(grads, inv_scale, found_inf)
    except RuntimeError as e:
        raise retyped(e) from None


def l2_norm(tensors, per_tensor=False, inv_scale=None, found_inf=None, max_norm=0.0):
    try:
        return _norm(tensors, per_tensor, inv_scale, found_inf, max_norm)
    except RuntimeError as e:
        raise retyped(e) from None


# Fake implementations: the in-place ops return nothing; l2_norm returns fresh float32 tensors
# on the inputs' device: a 0-dim total, per-tensor norms (or an empty tensor), the clip
# coefficient (or an empty tensor).
@torch.library.register_fake("dsfast::cuda_adam_")
def _adam_fake(grads, params, exp_avgs, exp_avg_sqs, steps, model_copies, lr, beta1, beta2, eps, weight_decay,
               adamw, bias_correction, inv_scale=None, clip_coef=None, found_inf=None, maximize=False):
    return None


@torch.library.register_fake("dsfast::cuda_sgd_")
def _sgd_fake(grads, params, momentum_buffers, model_copies, lr, momentum, dampening, weight_decay, nesterov,
              first_step, inv_scale=None, clip_coef=None, found_inf=None, maximize=False):
    return None


@torch.library.register_fake("dsfast::cuda_unscale_and_check_")
def _unscale_fake(grads, inv_scale, found_inf):
    return None


@torch.library.register_fake("dsfast::cuda_l2_norm")
def _norm_fake(tensors, per_tensor=False, inv_scale=None, found_inf=None, max_norm=0.0):
    if not tensors:
        raise RuntimeError("dsfast l2_norm: empty param list")
    dev = tensors[0].device
    total = torch.empty((), dtype=torch.float32, device=dev)
    per = torch.empty((len(tensors) if per_tensor else 0,), dtype=torch.float32, device=dev)
    clip = torch.empty(() if max_norm > 0.0 else (0,), dtype=torch.float32, device=dev)
    return total, per, clip
