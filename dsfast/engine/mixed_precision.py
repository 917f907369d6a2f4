"""Precision strategies (fp32 / fp16 / bf16) and the one pass that turns reduced grads into optimizer grads.

fp32: the optimizer updates the model's own parameters; their `.grad` are slices of the flat buckets.
fp16/bf16: the model runs in half precision; the optimizer updates fp32 master copies whose `.grad` are slices of
fp32 buckets, and the updated masters are copied back into the model after each applied step.
"""
import math

import torch

from ..ops import multi_tensor as mt
from .grad_buffers import GradBuffers


class FullPrecision:
    name = "fp32"
    dtype = None

    def __init__(self, module, params, bucket_elems, allocate=None):
        self.params = params
        self.masters = params
        self.buffers = GradBuffers(params, bucket_elems, grads_are_views=True, allocate=allocate)

    def master_of(self, param):
        return param

    def optimizer_step(self, optimizer, **step_kwargs):
        optimizer.step(**step_kwargs)


class HalfPrecision:
    """fp32 master weights + fp32 gradient accumulation for a model cast to `dtype` (fp16 or bf16)."""

    def __init__(self, module, params, bucket_elems, dtype, allocate=None):
        self.dtype = dtype
        self.name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
        self.params = params
        # masters come from the fp32 weights before the cast, so no precision is lost at the start
        self.masters = [torch.nn.Parameter(p.detach().clone().float(), requires_grad=True) for p in params]
        self._master = {id(p): m for p, m in zip(params, self.masters)}
        module.to(dtype)
        self.buffers = GradBuffers(params, bucket_elems, grads_are_views=False, allocate=allocate)
        for p, m in zip(params, self.masters):
            self.buffers.attach_master(p, m)

    def master_of(self, param):
        """The fp32 master of a trained parameter (a frozen one is returned as is: it has no master)."""
        return self._master.get(id(param), param)

    def optimizer_step(self, optimizer, **step_kwargs):
        """optimizer.step(**step_kwargs), then the updated masters into the half-precision model. dsfast's CPU
        optimizers write the 16-bit copy in the same pass over memory (their `fp16_param_groups` argument).
        step_kwargs (grad_scale/found_inf/clip_coef, device_step.py): a step the kernel skipped leaves the
        masters as they were, so copying them back unconditionally is correct and needs no host read."""
        if _takes_half_outputs(optimizer) and not step_kwargs:
            model_of = {id(m): p for p, m in zip(self.params, self.masters)}
            optimizer.step(fp16_param_groups=[[model_of.get(id(m), m) for m in g["params"]]
                                              for g in optimizer.param_groups])
            return
        optimizer.step(**step_kwargs)
        with torch.no_grad():
            if self.params:
                torch._foreach_copy_(self.params, self.masters)


def _takes_half_outputs(optimizer):
    """dsfast's CPU optimizers write the 16-bit copies in their update pass (step(fp16_param_groups=))."""
    from ..optim._cpu_op import CPUOptimizer
    return isinstance(optimizer, CPUOptimizer)


def build_precision(precision, module, params, bucket_elems, allocate=None):
    if precision == "fp32":
        return FullPrecision(module, params, bucket_elems, allocate)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    if dtype is None:
        raise ValueError(f"unknown precision {precision!r}; valid: fp32, fp16, bf16")
    return HalfPrecision(module, params, bucket_elems, dtype, allocate)


def global_norm(flats):
    """L2 norm over all flat gradient buckets, as a 0-dim fp32 tensor (no host sync)."""
    total, _ = mt.l2_norm(flats, per_tensor=False)
    return total.reshape(())


@torch.no_grad()
def finalize_grads(flats, factor, clip, check_overflow):
    """Scale reduced grads by `factor` (1/world x 1/loss_scale), clip to `clip` (0 = off), look for inf/NaN.

    Returns (applied, norm): applied=False means an overflow was found (grads untouched; the caller skips the
    step); norm is the global gradient norm after `factor` (None when neither clipping nor overflow checking
    asked for it). One read pass for the norm (when needed) and one write pass, like torch clip_grad_norm_.
    """
    if not flats:
        return True, None
    if check_overflow and clip <= 0:
        # no norm needed: one fused pass unscales and flags inf/NaN (grads are dropped anyway on overflow)
        found_inf = torch.zeros((), device=flats[0].device)
        mt.unscale_and_check_(flats, torch.full((), factor, device=flats[0].device), found_inf)
        return (False, float("inf")) if bool(found_inf) else (True, None)
    if clip > 0 or check_overflow:
        raw_value = float(global_norm(flats))
        if check_overflow and not math.isfinite(raw_value):
            return False, float("inf")
        norm = raw_value * factor
        coef = factor
        if clip > 0:
            coef *= min(1.0, clip / (norm + 1e-6))
    else:
        norm, coef = None, factor
    if coef != 1.0:
        torch._foreach_mul_(flats, coef)
    return True, norm
