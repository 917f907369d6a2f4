"""The second half of the ZeRO step (stages 1-3): the optimizer applies the decision to this rank's shards.

The optimizer was built over the shard parameters (one fp32 master per bucket, flat_shards.py / stage3.py), so it
is stepped through the one optimizer contract (optim/amp_step.py) with the gradient shards as `grads` (any float
dtype, read in place) and, for a 16-bit model, the model-dtype slices as `out16` (written in the same pass). The
1/world x 1/loss_scale factor and the clip coefficient travel as grad_scale / clip_coef and the overflow flag as
found_inf: no separate scaling pass, and no reading or creating of optimizer.state here.
"""
import torch

from ..optim.amp_step import amp_step


@torch.no_grad()
def step_shards(store, optimizer, grads, decision):
    """Update every shard from its gradient (`grads[i]` for `store.shards[i]`) as `decision` (decide.py) says;
    the model-dtype slices hold the new values afterwards (all-gather not included)."""
    shards = store.shards
    host_grads = [g if g.device == s.device else g.to(s.device, non_blocking=True) for g, s in zip(grads, shards)]
    store.placement.synchronize()   # the host copies must land before the CPU reads them
    index = {id(s): i for i, s in enumerate(shards)}
    groups = [[index[id(s)] for s in group["params"]] for group in optimizer.param_groups]
    out16 = None
    if store.mixed:   # offload to a distinct host: the host copies, then one copy to the device below
        out16 = [[store.host16[i] if store.host16[i] is not None else store.slice16(i) for i in ids]
                 for ids in groups]
    amp_step(optimizer, grads=[[host_grads[i] for i in ids] for ids in groups], out16=out16,
             **decision.step_kwargs())
    if store.mixed:
        for i, h in enumerate(store.host16):
            if h is not None:
                store.slice16(i).copy_(h, non_blocking=True)
    else:
        store.write_back()   # fp32 masters apart from the parameters (offload with a GPU); a no-op otherwise
