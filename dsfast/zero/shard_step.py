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

from ..optim.cpu_adam import CPUAdam
from ..optim.cpu_sgd import CPUSGD
from ..optim.functional import adam_, sgd_
from ..optim.fused_adam import FusedAdam


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


def _adam_group(opt, group, shards, grads, scale, outs):
    for shard in shards:
        state = opt.state[shard]
        if len(state) == 0:
            state["step"] = torch.zeros((), dtype=torch.float32, device=shard.device)
            state["exp_avg"] = torch.zeros_like(shard, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(shard, memory_format=torch.contiguous_format)
    states = [opt.state[s] for s in shards]
    adam_([s.data for s in shards], grads, [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states],
          [st["step"] for st in states], lr=group["lr"], betas=group["betas"], eps=group["eps"],
          weight_decay=group["weight_decay"], adamw=bool(group.get("adamw_mode", group.get("adam_w_mode", True))),
          bias_correction=bool(group.get("bias_correction", True)),
          grad_scale=-scale if group.get("maximize") else scale, out16=outs, isa=getattr(opt, "isa", "auto"))


def _sgd_group(opt, group, shards, grads, scale, outs):
    momentum = group["momentum"]
    bufs, firsts = [], []
    for shard in shards:
        buf = opt.state[shard].get("momentum_buffer") if momentum != 0 else None
        firsts.append(buf is None)
        bufs.append(torch.empty_like(shard, memory_format=torch.contiguous_format) if buf is None else buf)
    sgd_([s.data for s in shards], grads, bufs, firsts, lr=group["lr"], momentum=momentum,
         dampening=group["dampening"], weight_decay=group["weight_decay"], nesterov=group["nesterov"],
         grad_scale=-scale if group.get("maximize") else scale, out16=outs, isa=opt.isa)
    if momentum != 0:   # buffers enter the state once seeded (a refused step leaves none behind)
        for shard, buf in zip(shards, bufs):
            opt.state[shard]["momentum_buffer"] = buf


def _flat_kernel(optimizer, shards):
    """The functional update for this optimizer over these shards, when one applies: dsfast's CPU Adam/SGD on CPU
    masters (offload), dsfast's FusedAdam on CUDA masters. None: step the optimizer itself."""
    if not shards:
        return None
    on_cpu = all(s.device.type == "cpu" for s in shards)
    if on_cpu and isinstance(optimizer, CPUAdam):
        return _adam_group
    if on_cpu and isinstance(optimizer, CPUSGD):
        return _sgd_group
    if not on_cpu and isinstance(optimizer, FusedAdam) and not optimizer.master_weights:
        return _adam_group
    return None


@torch.no_grad()
def step_shards(store, optimizer, grads, scale):
    """Update every shard from its gradient (`grads[i]` for `store.shards[i]`, any float dtype, on the device)
    multiplied by `scale`; the 16-bit parameter slices hold the new values afterwards (all-gather not included)."""
    shards = store.shards
    host_grads = [g if g.device == s.device else g.to(s.device, non_blocking=True) for g, s in zip(grads, shards)]
    if store.offload and store.device.type == "cuda":
        torch.cuda.current_stream().synchronize()   # the host copies must land before the CPU reads them
    kernel = _flat_kernel(optimizer, shards)
    if kernel is not None:
        index = {id(s): i for i, s in enumerate(shards)}
        for group in optimizer.param_groups:   # one multi-tensor call per param group
            ids = [index[id(s)] for s in group["params"]]
            outs = []
            if store.mixed:
                outs = [store.host16[i] if store.host16[i] is not None else
                        store.slice16(i) for i in ids]
            if ids:
                kernel(optimizer, group, [shards[i] for i in ids], [host_grads[i] for i in ids], scale, outs)
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
