"""deepspeed.runtime.utils' norm helpers that programs call outside the engine: clip_grad_norm_ (DeepSpeed's
stage-0 clipping, averaged over the data-parallel ranks), get_global_norm (a norm from per-group norms) and
get_weight_norm (the parameters' own norm, -1 when not finite), with DeepSpeed 0.19.8's arithmetic step by step
so that the bits agree. `mpu` is the caller's model-parallel unit (Megatron style); dsfast has no tensor
parallelism of its own but sums over the unit's group as DeepSpeed does."""
import math

import torch
import torch.distributed as dist

from ..comm.where import wait_now
from ..utils import groups
from ..zero.step.clip_arith import stage0_coef


def is_model_parallel_parameter(p):
    """True where a parameter is marked split across model-parallel ranks (Megatron's attributes)."""
    return bool(getattr(p, "model_parallel", False) or getattr(p, "tensor_model_parallel", False))


def is_invalid_grad_norm(norm):
    """A norm that is not finite or is negative (DeepSpeed's marker for an overflowed one)."""
    if torch.is_tensor(norm):
        return bool((~torch.isfinite(norm) | (norm < 0)).any())
    return not math.isfinite(float(norm)) or norm < 0


def tensor_model_parallel_rank(mpu):
    """The unit's tensor-parallel rank, whichever spelling it has (0 without a unit)."""
    if mpu is None:
        return 0
    for name in ("get_tensor_model_parallel_rank", "get_slice_parallel_rank", "get_model_parallel_rank"):
        if hasattr(mpu, name):
            return getattr(mpu, name)()
    raise TypeError(f"mpu {type(mpu).__name__} has none of get_tensor_model_parallel_rank, get_slice_parallel_rank, "
                    "get_model_parallel_rank")


def _all_reduce(t, op, group):
    """All-reduce in place, through the accelerator when the backend cannot take a host tensor (NCCL)."""
    if dist.get_backend(group) == "nccl" and t.device.type != "cuda":
        on_gpu = t.to(torch.device("cuda", torch.cuda.current_device()))
        wait_now(dist.all_reduce(on_gpu, op=op, group=group, async_op=True), ("grad norm",))
        t.copy_(on_gpu)
    else:
        wait_now(dist.all_reduce(t, op=op, group=group, async_op=True), ("grad norm",))
    return t


def _norm_type(norm_type):
    p = float(norm_type)
    if not p > 0:
        raise ValueError(f"norm_type must be positive or inf, got {norm_type!r}")
    return p


def get_global_norm(norm_list):
    """sqrt of the sum of the squared norms (a Python float); inf when any is not finite or negative."""
    if any(is_invalid_grad_norm(n) for n in norm_list):
        return float("inf")
    total = 0.0
    for n in norm_list:
        total += n ** 2.0
    return math.sqrt(total)


def clip_grad_norm_(parameters, max_norm, norm_type=2, mpu=None):
    """Scale the gradients in place by min(1, max_norm / (norm + 1e-6)) and return the norm (a tensor on the
    parameters' device). The norm is each rank's gradient norm (summed over the mpu's group, parameters split
    across it counted on every rank, the rest on its rank 0) averaged over the data-parallel ranks: ranks with
    different gradients (expert parameters) clip by the same number, as DeepSpeed's do."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    parameters = [p for p in parameters if p.grad is not None]
    if not parameters:
        raise ValueError("clip_grad_norm_: no parameter has a gradient (.grad is None for all); run backward first")
    p_norm = _norm_type(norm_type)
    mp_group = mpu.get_model_parallel_group() if mpu is not None else None
    if p_norm == math.inf:
        total = torch.stack([p.grad.detach().abs().max().float() for p in parameters]).max()
        if mpu is not None:
            _all_reduce(total, dist.ReduceOp.MAX, mp_group)
    else:
        counted = [p for p in parameters
                   if mpu is None or mpu.get_model_parallel_rank() == 0 or is_model_parallel_parameter(p)]
        if counted:
            total = torch.stack([p.grad.detach().float().norm(p_norm) for p in counted]).pow(p_norm).sum().float()
        else:
            total = torch.zeros(1, device=parameters[0].device)
        if mpu is not None:
            _all_reduce(total, dist.ReduceOp.SUM, mp_group)
        total = total.pow(1.0 / p_norm)
    # the mean over data-parallel ranks, each rank's share taken first (DeepSpeed's order of operations)
    total = total * 1.0 / float(groups._get_data_parallel_world_size())
    group = groups._get_data_parallel_group()
    if group is not None:
        _all_reduce(total, dist.ReduceOp.SUM, group)
    total = total.to(parameters[0].device)
    coef = stage0_coef(total, max_norm)
    for p in parameters:
        p.grad.detach().mul_(coef)
    return total


def get_weight_norm(parameters, norm_type=2, mpu=None):
    """The parameters' own p-norm as a Python float (summed over the mpu's group, pipeline-replicated copies and,
    off its rank 0, unsplit parameters left out), or -1 when it is not finite."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    parameters = list(parameters)
    p_norm = _norm_type(norm_type)
    mp_group = mpu.get_model_parallel_group() if mpu is not None else None
    if p_norm == math.inf:
        if not parameters:
            raise ValueError("get_weight_norm: no parameters given")
        total = torch.tensor([float(max(p.detach().abs().max() for p in parameters))])
        if mpu is not None:
            _all_reduce(total, dist.ReduceOp.MAX, mp_group)
        norm = total[0].item()
    else:
        mp_rank = tensor_model_parallel_rank(mpu)
        total = 0.0
        for p in parameters:
            if getattr(p, "ds_pipe_replicated", False):
                continue
            if mp_rank > 0 and not is_model_parallel_parameter(p):
                continue
            total += p.detach().float().norm(p_norm) ** p_norm
        total = torch.tensor([float(total)])    # float32, as DeepSpeed's FloatTensor
        if mpu is not None:
            _all_reduce(total, dist.ReduceOp.SUM, mp_group)
        norm = total[0].item() ** (1.0 / p_norm)
    return -1 if math.isinf(norm) or math.isnan(norm) else norm
