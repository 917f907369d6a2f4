"""The optimizer step on a rank's shards: global norm across ranks, clip, overflow skip, update, write-back.

One read pass computes the squared norm of this rank's gradient shards; a single all-reduce of that scalar gives
the global norm on every rank, so clipping uses one norm over all partitions and an overflow on any rank (a
non-finite norm) skips the step on every rank. The scaling (1/world x 1/loss_scale x clip coefficient) is never
a separate pass: dsfast's CPU optimizers take it as `grad_scale` and read the 16-bit gradient directly, writing
the 16-bit parameter slice in the same pass (the offload path); any other optimizer gets an fp32 gradient made
by one scaled copy, then the masters are written back.
"""
import math

import torch
import torch.distributed as dist

from ..optim.cpu_adam import CPUAdam, adam_flat_step
from ..optim.cpu_sgd import CPUSGD, sgd_flat_step


@torch.no_grad()
def global_grad_norm(grads, world, group=None):
    """sqrt(sum over ranks of the squared norms of their gradient shards), as a float (one all-reduce)."""
    device = grads[0].device if grads else torch.device("cpu")
    sq = torch.zeros((), dtype=torch.float32, device=device)
    for g in grads:
        if g.numel():
            sq += torch.linalg.vector_norm(g, dtype=torch.float32).square()
    if world > 1:
        dist.all_reduce(sq, group=group)
    return math.sqrt(float(sq)) if math.isfinite(float(sq)) else float("inf")


def _adam_shard(opt, group, shard, grad, scale, out16):
    state = opt.state[shard]
    if len(state) == 0:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(shard, memory_format=torch.contiguous_format)
        state["exp_avg_sq"] = torch.zeros_like(shard, memory_format=torch.contiguous_format)
    if group.get("maximize"):
        scale = -scale
    adam_flat_step(shard.data, grad, state["exp_avg"], state["exp_avg_sq"], state["step"], lr=group["lr"],
                   betas=group["betas"], eps=group["eps"], weight_decay=group["weight_decay"],
                   adamw=bool(group["adamw_mode"]), bias_correction=bool(group["bias_correction"]),
                   grad_scale=scale, out16=out16, isa=opt.isa)


def _sgd_shard(opt, group, shard, grad, scale, out16):
    state = opt.state[shard]
    momentum = group["momentum"]
    buf, first = None, False
    if momentum != 0:
        buf = state.get("momentum_buffer")
        first = buf is None
        if first:
            buf = torch.empty_like(shard, memory_format=torch.contiguous_format)
    if group.get("maximize"):
        scale = -scale
    sgd_flat_step(shard.data, grad, buf, lr=group["lr"], momentum=momentum, dampening=group["dampening"],
                  weight_decay=group["weight_decay"], nesterov=group["nesterov"], first_step=first, grad_scale=scale,
                  out16=out16, isa=opt.isa)
    if first:
        state["momentum_buffer"] = buf


_FLAT = {CPUAdam: _adam_shard, CPUSGD: _sgd_shard}


def _flat_kernel(optimizer, shards):
    """The flat CPU kernel for this optimizer, when it can step these shards directly (CPU masters)."""
    fn = next((f for cls, f in _FLAT.items() if isinstance(optimizer, cls)), None)
    if fn is None or not shards or any(s.device.type != "cpu" for s in shards):
        return None
    return fn


@torch.no_grad()
def step_shards(store, optimizer, grads, scale):
    """Update every shard from its gradient (`grads[i]` for `store.shards[i]`, any float dtype, on the device)
    multiplied by `scale`; the 16-bit parameter slices hold the new values afterwards (all-gather not included)."""
    shards = store.shards
    host_grads = [g if g.device == s.device else g.to(s.device, non_blocking=True) for g, s in zip(grads, shards)]
    if any(g is not h for g, h in zip(grads, host_grads)) and torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()   # the host copies must land before the CPU reads them
    kernel = _flat_kernel(optimizer, shards)
    if kernel is not None:
        index = {id(s): i for i, s in enumerate(shards)}
        for group in optimizer.param_groups:
            for shard in group["params"]:
                i = index[id(shard)]
                out16 = None
                if store.mixed:
                    out16 = store.host16[i] if store.host16[i] is not None else store.slice16(i)
                kernel(optimizer, group, shard, host_grads[i], scale, out16)
        for i, h in enumerate(store.host16):
            if h is not None:
                store.slice16(i).copy_(h, non_blocking=True)
        return
    for shard, g in zip(shards, host_grads):
        shard.grad = g.to(torch.float32) * scale if g.dtype != torch.float32 or scale != 1.0 else g
    optimizer.step()
    for shard in shards:
        shard.grad = None
    store.write_back()
