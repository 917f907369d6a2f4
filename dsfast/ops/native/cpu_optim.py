"""The native cpu_optim op (csrc/bindings/cpu_optim.cpp) behind the reference's functions:
adam_step, sgd_step, available_isas, best_isa, openmp_enabled, same arguments
(dsfast.ops.reference.cpu_optim), and the fake implementations that let FakeTensor,
torch.compile and opcheck run through the mutating ops."""
import operator
from itertools import repeat

import torch

from ..reference import cpu_optim as _ref
from ._errors import retyped

_adam = torch.ops.dsfast.cpu_adam_step.default
_sgd = torch.ops.dsfast.cpu_sgd_step.default


def abi():
    """'stable' or 'classic': the torch ABI the loaded binary was built for."""
    return torch.ops.dsfast.cpu_optim_abi()


def available_isas():
    return torch.ops.dsfast.cpu_available_isas().split(",")


def best_isa():
    return available_isas()[0]


def openmp_enabled():
    return torch.ops.dsfast.cpu_openmp_enabled()


def _fill_missing_outs(params, outs):
    """The op takes [] or one 16-bit output per param; a None entry (no copy wanted for that
    param) gets a scratch tensor, so one call still checks everything before updating anything."""
    if not outs or not any(map(operator.is_, outs, repeat(None))):
        return outs
    if len(outs) != len(params):
        raise ValueError(f"outs has {len(outs)} entries; pass [] or one per param ({len(params)})")
    return [torch.empty(p.numel(), dtype=torch.bfloat16) if o is None and isinstance(p, torch.Tensor) else o
            for p, o in zip(params, outs)]


def adam_step(params, grads, exp_avgs, exp_avg_sqs, outs, steps, lr, beta1, beta2, eps, weight_decay, adamw,
              bias_correction, grad_scale=1.0, num_threads=0, isa="auto", label="params"):
    """Adam/AdamW over lists of fp32 CPU tensors in one parallel region; increments each step."""
    outs = _fill_missing_outs(params, outs)
    try:
        _adam(params, grads, exp_avgs, exp_avg_sqs, outs, steps, lr, beta1, beta2, eps, weight_decay, adamw,
              bias_correction, grad_scale, num_threads, isa, label)
    except RuntimeError as e:
        raise retyped(e, lambda: _ref._check_lists(("outs",), params=params, grads=grads, exp_avgs=exp_avgs,
                                                  exp_avg_sqs=exp_avg_sqs, outs=outs, steps=steps)) from None


def sgd_step(params, grads, momentum_buffers, outs, first_steps, lr, momentum, dampening, weight_decay, nesterov,
             grad_scale=1.0, num_threads=0, isa="auto", label="params"):
    """SGD (momentum, dampening, nesterov, weight decay) over lists of fp32 CPU tensors."""
    outs = _fill_missing_outs(params, outs)
    try:
        _sgd(params, grads, momentum_buffers, outs, first_steps, lr, momentum, dampening, weight_decay, nesterov,
             grad_scale, num_threads, isa, label)
    except RuntimeError as e:
        raise retyped(e, lambda: _ref._check_lists(("outs",), params=params, grads=grads,
                                                  momentum_buffers=momentum_buffers, outs=outs)) from None


# Fake (meta) implementations: the ops only mutate their inputs and return nothing, so a fake
# run only checks what the kernel would refuse (metadata alone: devices, dtypes, sizes). That
# also refuses real meta-device tensors, which dispatch here, with the kernel's message.
@torch.library.register_fake("dsfast::cpu_adam_step")
def _adam_fake(params, grads, exp_avgs, exp_avg_sqs, outs, steps, lr, beta1, beta2, eps, weight_decay, adamw,
               bias_correction, grad_scale=1.0, num_threads=0, isa="auto", label="params"):
    _ref.check_adam_args(params, grads, exp_avgs, exp_avg_sqs, outs, steps, label)


@torch.library.register_fake("dsfast::cpu_sgd_step")
def _sgd_fake(params, grads, momentum_buffers, outs, first_steps, lr, momentum, dampening, weight_decay, nesterov,
              grad_scale=1.0, num_threads=0, isa="auto", label="params"):
    _ref.check_sgd_args(params, grads, momentum_buffers, outs, first_steps, momentum, label)
