"""Stage 0's master copies (fp32 / fp16 / bf16 models): what the optimizer updates and where the 16-bit copy goes.
(Which precision trains is the owner's precision.PrecisionPolicy; these hold the tensors it implies.)

fp32: the optimizer updates the model's own parameters; their `.grad` are slices of the flat buckets.
fp16/bf16: the model runs in half precision; the optimizer updates fp32 master copies whose `.grad` are slices of
fp32 buckets, and writes each updated master into the model's 16-bit parameter in the same pass (`out16_groups`,
the amp contract's out16: optim/amp_step.py).
"""
import torch

from ..grads.buffers import GradBuffers, replicated_layout


class FullPrecision:
    def __init__(self, module, params, bucket_elems, allocate=None):
        self.params = params
        self.masters = params
        self.buffers = GradBuffers(params, replicated_layout(params, bucket_elems, True), grads_are_views=True,
                                   allocate=allocate)

    def master_of(self, param):
        return param

    def out16_groups(self, optimizer):
        return None


class HalfPrecision:
    """fp32 master weights + fp32 gradient accumulation for a model cast to `dtype` (fp16 or bf16)."""

    def __init__(self, module, params, bucket_elems, dtype, allocate=None):
        self.params = params
        # masters come from the fp32 weights before the cast, so no precision is lost at the start
        self.masters = [torch.nn.Parameter(p.detach().clone().float(), requires_grad=True) for p in params]
        self._master = {id(p): m for p, m in zip(params, self.masters)}
        module.to(dtype)
        self.buffers = GradBuffers(params, replicated_layout(params, bucket_elems, False), grads_are_views=False,
                                   allocate=allocate)
        for p, m in zip(params, self.masters):
            self.buffers.attach_master(p, m)

    def master_of(self, param):
        """The fp32 master of a trained parameter (a frozen one is returned as is: it has no master)."""
        return self._master.get(id(param), param)

    def out16_groups(self, optimizer):
        """Per param group of the optimizer, the 16-bit model parameter each master's update is written into."""
        model_of = {id(m): p for p, m in zip(self.params, self.masters)}
        return [[model_of.get(id(m), m) for m in g["params"]] for g in optimizer.param_groups]


def build_master_copies(policy, module, params, bucket_elems, allocate=None):
    """policy: the owner's precision.PrecisionPolicy (which already refused an unknown precision)."""
    if not policy.mixed:
        return FullPrecision(module, params, bucket_elems, allocate)
    return HalfPrecision(module, params, bucket_elems, policy.param_dtype, allocate)
