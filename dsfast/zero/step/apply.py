"""The second half of the ZeRO step (stages 1-3): the optimizer applies the decision to this rank's shard units.

The optimizer was built over the units' shard parameters (shard_unit.py), so it is stepped through the one
optimizer contract's per-unit entry (optim/amp_step.py prepare_step: the hyperparameters validated once per step)
with each unit's gradient (any float dtype, read in place; its host copy where the placement made one) and, for a
16-bit model, each unit's 16-bit output (written in the same pass). The 1/world x 1/loss_scale factor and the clip
coefficient travel as grad_scale / clip_coef and the overflow flag as found_inf: no separate scaling pass, and no
reading or creating of optimizer.state here.

One loop steps every placement: it walks the units in batches that are in host memory. With every unit resident
the walk is one batch of all of them (one kernel call per param group); with the states or stage 3's shards on NVMe
(the unit says: shard_unit.ShardUnit.states_swap / param_swap) it is one unit at a time, read ahead and written
behind, each stepped while its bytes are in a window buffer: the same kernels on the same values (exact for an
element-wise optimizer, which bind_optimizer checked: optim/element_wise.py).
"""
import contextlib
from operator import itemgetter

import torch

from ...optim.amp_step import prepare_step

_FIRST = itemgetter(0)


@torch.no_grad()
def step_shards(store, optimizer, decision):
    """Update every unit of `store` as `decision` (decide.py) says; the model-dtype slices hold the new values
    afterwards (all-gather not included)."""
    if count_swap_step(store) and not decision.applied():   # (a skipped step reads and writes nothing from NVMe)
        return
    step = prepare_step(optimizer, **decision.step_kwargs())
    where = _positions(optimizer)
    with contextlib.closing(_walk(store)) as batches:
        for batch in batches:
            _step_batch(store, step, where, decision, batch, defer_uploads=True)
    if store.param_swap is not None:
        # every rank learns of a failed write in this step (sharded.step), not in the next forward
        store.param_swap.flush()


def count_swap_step(store):
    """One more optimizer step of this engine (skipped ones included) for the swaps' I/O errors to name; whether
    there is a swap."""
    swaps = [s for s in (store.swap, store.param_swap) if s is not None]
    for s in swaps:
        s.steps += 1
        s.window.step = s.steps
    return bool(swaps)


def unit_stepper(store, optimizer, decision):
    """step(unit): one resident unit's update (and its 16-bit copy back) exactly as step_shards makes it; prepared
    once per step, on the caller's thread (the overlapped step's worker then calls it: step/overlap.py)."""
    step = prepare_step(optimizer, **decision.step_kwargs())
    where = _positions(optimizer)

    def step_unit(unit):
        with unit.writing16():   # (stage 3's shard on NVMe: its new values written back behind the next units)
            _step_batch(store, step, where, decision, [unit])
    return step_unit


def _walk(store):
    """Yield the units in batches whose bytes are in host memory while the batch is stepped: all of them at once
    when every unit is resident; else one at a time through the states' window (read ahead, written behind), its
    16-bit slice in a buffer written back behind the next units' step (stage 3's shards on NVMe)."""
    if store.swap is None and store.param_swap is None:
        yield store.units
        return
    units = store.units if store.swap is None else store.swap.windows(store.swap.step_order(store.units))
    for unit in units:
        with unit.writing16():
            yield [unit]


def _positions(optimizer):
    """(number of param groups, id(param) -> (param group, index in it)): where each unit's shard sits in the
    optimizer, found once per step."""
    groups = optimizer.param_groups
    return len(groups), {id(p): (gi, j) for gi, g in enumerate(groups) for j, p in enumerate(g["params"])}


def _step_batch(store, step, where, decision, units, defer_uploads=False):
    """Step `units` (in host memory). Their 16-bit values go back on the h2d lane where the slices are device
    memory: defer_uploads, each copy's event becomes the unit's step_event (the serial step waits them all before
    its all-gather; an NVMe window before reusing the buffer); else they are waited here (one unit stepped in a
    worker: the item's own event then covers its upload)."""
    for u in units:   # each unit's gradient copy to the host has landed (its own event, not the whole stream)
        u.grad_event.wait()
    members = _by_group(where, units)
    mixed = store.mixed
    parts = [([j for j, _ in ms], [_on(u.update_grad, u.shard) for _, u in ms],
              [u.out16 for _, u in ms] if mixed else None) for ms in members]
    step(parts)
    copies_back = mixed and any(u.host16 is not None for u in units)
    if copies_back or (not mixed and not store.masters_are_params):
        # the host read is free here: a CPU optimizer (the one writing host copies) has read the flag already
        if decision.applied():
            lane = store.upload_lane()   # (the h2d lane where the slices are device memory: step_event each)
            for u in units:
                event = u.finish_step(mixed, store.masters_are_params, lane)
                if defer_uploads:
                    u.step_event = event
                else:
                    event.wait()


def _by_group(where, units):
    """Per param group of the optimizer, [(index in the group, unit)] of `units`, in the group's order (a unit
    whose shard the optimizer does not hold is not stepped)."""
    groups, position = where
    members = [[] for _ in range(groups)]
    for u in units:
        found = position.get(id(u.shard))
        if found is not None:
            members[found[0]].append((found[1], u))
    for ms in members:
        ms.sort(key=_FIRST)   # (already in order, or in runs: the store keeps the optimizer's order)
    return members


def _on(grad, shard):
    """The gradient where the shard is (a copy only if no placement made one there already)."""
    return grad if grad.device == shard.device else grad.to(shard.device, non_blocking=True)
