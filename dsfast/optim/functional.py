"""Functional Adam/AdamW and SGD over tensor lists, dispatching by device (the shape of torch/optim/adam.py).

    adam_(params, grads, exp_avgs, exp_avg_sqs, steps, lr=, betas=, eps=, weight_decay=, adamw=, ...)
    sgd_(params, grads, momentum_buffers, first_steps, lr=, momentum=, ...)
CPU tensors run dsfast's SIMD kernel (one OpenMP region over every tensor of the call); CUDA tensors the
multi-tensor CUDA kernel (dsfast.ops.multi_tensor). Gradients may be fp32, bf16 or fp16 and are read as they are;
`grad_scale` multiplies them first (1/world x 1/loss_scale x clip coefficient in the ZeRO step: no separate pass);
`out16`, when given, receives each updated parameter rounded to 16 bits in the same pass. `round_seed` nonzero
(CPU kernels, bf16 params): stochastic rounding of the updated params, a new seed per call. CPUAdam, CPUSGD and the
ZeRO shard step all call these; `label` names the tensors in errors (default "the partition").
"""
import torch

from . import _cpu_op
from .validation import check_adam_hparams, check_sgd_hparams


def adam_(params, grads, exp_avgs, exp_avg_sqs, steps, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
          adamw=True, bias_correction=True, grad_scale=1.0, out16=(), isa="auto", group_index=None,
          indices=None, round_seed=0, validated=False):
    """One step on every tensor of the lists, in place; steps (float32 one-element tensors) are incremented.
    validated: the caller checked the hyperparameters already (an optimizer, once per step)."""
    if not params:
        return
    if validated:
        beta1, beta2 = betas
    else:
        lr, (beta1, beta2), eps, weight_decay = check_adam_hparams(lr, betas, eps, weight_decay)
    device = params[0].device
    if device.type != "cuda":   # CPU (any other device gets the CPU kernel's error naming the tensor)
        _cpu_op.call(_cpu_op.op().adam_step, group_index, indices or range(len(params)), list(params), list(grads),
                     list(exp_avgs), list(exp_avg_sqs), list(out16), list(steps), lr, beta1, beta2, eps,
                     weight_decay, bool(adamw), bool(bias_correction), float(grad_scale), _cpu_op.num_threads(), isa,
                     round_seed=int(round_seed))
        return
    if round_seed:
        raise ValueError("stochastic rounding (round_seed) is implemented by the CPU kernels only; the CUDA kernel "
                         "rounds to nearest even")
    from ..ops import multi_tensor
    inv = torch.full((), float(grad_scale), dtype=torch.float32, device=device)   # multiplies the gradients
    torch._foreach_add_(list(steps), 1)
    multi_tensor.backend(device).adam_(list(grads), list(params), list(exp_avgs), list(exp_avg_sqs), list(steps),
                                       list(out16), lr, beta1, beta2, eps, weight_decay, bool(adamw),
                                       bool(bias_correction), inv, None, None, False)


def sgd_(params, grads, momentum_buffers, first_steps, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
         nesterov=False, grad_scale=1.0, out16=(), isa="auto", group_index=None, indices=None, round_seed=0,
         validated=False):
    """One SGD step in place; with momentum, first_steps[i] True seeds momentum_buffers[i] with the gradient.
    validated: the caller checked the hyperparameters already (an optimizer, once per step)."""
    if not params:
        return
    if not validated:
        lr, momentum, dampening, weight_decay, nesterov = check_sgd_hparams(lr, momentum, dampening, weight_decay,
                                                                            nesterov)
    if params[0].device.type == "cuda":
        raise ValueError("sgd_ runs on CPU tensors; CUDA tensors use FusedSGD")
    bufs = list(momentum_buffers) if momentum != 0 else []
    firsts = [bool(f) for f in first_steps] if momentum != 0 else []
    _cpu_op.call(_cpu_op.op().sgd_step, group_index, indices or range(len(params)), list(params), list(grads), bufs,
                 list(out16), firsts, lr, momentum, dampening, weight_decay, nesterov, float(grad_scale),
                 _cpu_op.num_threads(), isa, round_seed=int(round_seed))
