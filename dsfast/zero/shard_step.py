"""The second half of the ZeRO step (stages 1-3): the optimizer applies the decision to this rank's shard units.

The optimizer was built over the units' shard parameters (shard_unit.py), so it is stepped through the one
optimizer contract (optim/amp_step.py) with each unit's gradient (any float dtype, read in place; its host copy
where the placement made one) as `grads` and, for a 16-bit model, each unit's 16-bit output as `out16` (written in
the same pass). The 1/world x 1/loss_scale factor and the clip coefficient travel as grad_scale / clip_coef and the
overflow flag as found_inf: no separate scaling pass, and no reading or creating of optimizer.state here.
"""
import contextlib

import torch

from ..optim.amp_step import amp_step


@torch.no_grad()
def step_shards(store, optimizer, decision):
    """Update every unit of `store` as `decision` (decide.py) says; the model-dtype slices hold the new values
    afterwards (all-gather not included). With the states on NVMe (store.swap, nvme_states.NvmeStates) or stage 3's
    shards there (store.param_swap, nvme_params.NvmeParams) the units are stepped one by one in order, each while
    it is in host memory: the same kernels on the same values (an optimizer whose update of a parameter reads only
    that parameter's state: every element-wise one)."""
    store.placement.synchronize()   # the host copies of the gradients must land before the CPU reads them
    swap, params = store.swap, store.param_swap
    if swap is None and params is None:
        _step_units(store, optimizer, decision, store.units)
        return
    for s in (swap, params):   # (named in I/O errors: the optimizer steps of this engine, skipped ones included)
        if s is not None:
            s.steps += 1
            s.window.step = s.steps
    if not decision.applied():   # (a skipped step reads and writes nothing; a CPU optimizer reads the flag anyway)
        return
    group_of = {id(p): gi for gi, g in enumerate(optimizer.param_groups) for p in g["params"]}
    for unit in (swap.windows(store.units) if swap is not None else store.units):
        # stage 3's shards on NVMe: the 16-bit values go into a buffer written back behind the next units' step
        with _only(optimizer, unit.shard, group_of[id(unit.shard)]), store.writing16(unit):
            _step_units(store, optimizer, decision, [unit])
    if params is not None:
        params.flush()   # every rank learns of a failed write in this step (sharded.step), not in the next forward


def _step_units(store, optimizer, decision, units):
    index = {id(u.shard): u for u in units}
    groups = [[index[id(s)] for s in group["params"]] for group in optimizer.param_groups]
    grads = [[_on(u.update_grad, u.shard) for u in us] for us in groups]
    out16 = [[u.out16 for u in us] for us in groups] if store.mixed else None
    amp_step(optimizer, grads=grads, out16=out16, **decision.step_kwargs())
    copies_back = store.mixed and any(u.host16 is not None for u in units)
    if copies_back or (not store.mixed and not store.masters_are_params):
        # the host read is free here: a CPU optimizer (the one writing host copies) has read the flag already
        if decision.applied():
            for u in units:
                u.finish_step(store.mixed, store.masters_are_params)


@contextlib.contextmanager
def _only(optimizer, shard, group):
    """The optimizer's groups hold only `shard` (in its group, index `group`) for the block: one unit's step costs
    the same whatever the number of parameters (stage 3 has one unit per parameter)."""
    kept = [g["params"] for g in optimizer.param_groups]
    try:
        for gi, g in enumerate(optimizer.param_groups):
            g["params"] = [shard] if gi == group else []
        yield
    finally:
        for g, params in zip(optimizer.param_groups, kept):
            g["params"] = params


def _on(grad, shard):
    """The gradient where the shard is (a copy only if no placement made one there already)."""
    return grad if grad.device == shard.device else grad.to(shard.device, non_blocking=True)
