"""The second half of the ZeRO step (stages 1-3): the optimizer applies the decision to this rank's shard units.

The optimizer was built over the units' shard parameters (shard_unit.py), so it is stepped through the one
optimizer contract (optim/amp_step.py) with each unit's gradient (any float dtype, read in place; its host copy
where the placement made one) as `grads` and, for a 16-bit model, each unit's 16-bit output as `out16` (written in
the same pass). The 1/world x 1/loss_scale factor and the clip coefficient travel as grad_scale / clip_coef and the
overflow flag as found_inf: no separate scaling pass, and no reading or creating of optimizer.state here.
"""
import torch

from ..optim.amp_step import amp_step


@torch.no_grad()
def step_shards(store, optimizer, decision):
    """Update every unit of `store` as `decision` (decide.py) says; the model-dtype slices hold the new values
    afterwards (all-gather not included). With the states on NVMe (store.swap, nvme_states.NvmeStates) the units
    are stepped one by one in order, each while it is in host memory: the same kernels on the same values."""
    store.placement.synchronize()   # the host copies of the gradients must land before the CPU reads them
    swap = getattr(store, "swap", None)
    if swap is None:
        _step_units(store, optimizer, decision, store.units)
    elif decision.applied():   # (a skipped step reads and writes nothing; a CPU optimizer reads the flag anyway)
        for unit in swap.windows(store.units):
            _step_units(store, optimizer, decision, [unit])


def _step_units(store, optimizer, decision, units):
    chosen = {id(u.shard): u for u in units}
    groups = [[chosen.get(id(s)) for s in group["params"]] for group in optimizer.param_groups]
    # a unit not chosen has no gradient this call (the optimizers skip it) and no 16-bit output
    grads = [[_on(u.update_grad, u.shard) if u is not None else None for u in us] for us in groups]
    out16 = [[u.out16 if u is not None else None for u in us] for us in groups] if store.mixed else None
    amp_step(optimizer, grads=grads, out16=out16, **decision.step_kwargs())
    copies_back = store.mixed and any(u.host16 is not None for u in units)
    if copies_back or (not store.mixed and not store.masters_are_params):
        # the host read is free here: a CPU optimizer (the one writing host copies) has read the flag already
        if decision.applied():
            for u in units:
                u.finish_step(store.mixed, store.masters_are_params)


def _on(grad, shard):
    """The gradient where the shard is (a copy only if no placement made one there already)."""
    return grad if grad.device == shard.device else grad.to(shard.device, non_blocking=True)
