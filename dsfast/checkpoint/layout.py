"""The engine <-> checkpoint contract: which slices of which parameters this rank's optimizer holds.

checkpoint_layout(engine) -> Layout(records, replicated, stage, world_size): the engine's state owner
(dsfast/zero/owner.py) lists its SliceRecords; each says that elements [start, stop) of the flattened
parameter `name` live at opt_param.view(-1)[opt_offset: opt_offset + stop - start], where opt_param is the key of
engine.optimizer.state (its values are the fp32 master). Stage 0 holds whole parameters on every rank
(replicated: rank 0 alone writes them); ZeRO stages hold one slice per bucket. engine_after_load(engine) has the
owner write the loaded masters back into the model (and all-gather them at ZeRO stages).
"""
from dataclasses import dataclass, field
from typing import List

import torch

from dsfast.zero.owner import SliceRecord


@dataclass
class Layout:
    records: List[SliceRecord] = field(default_factory=list)
    replicated: bool = True
    stage: int = 0
    world_size: int = 1


def param_names(module):
    """{id(param): first qualified name} (tied weights keep their first name, as named_parameters does)."""
    return {id(p): n for n, p in module.named_parameters()}


def checkpoint_layout(engine):
    owner = engine.state_owner
    records = owner.checkpoint_layout(param_names(engine.module)) if engine.optimizer is not None else []
    return Layout(records, replicated=owner.stage == 0, stage=owner.stage, world_size=int(engine.world_size))


@torch.no_grad()
def engine_after_load(engine):
    """Loaded fp32 masters -> the model's parameters (nothing to copy when they are the same tensors).

    An engine without an optimizer (evaluation, a reference model) loads no masters: its masters follow the module
    just loaded instead, never the other way round (stale masters would overwrite the loaded weights). At stage 3
    the partitions took the loaded slices already and the owner publishes them."""
    owner = engine.state_owner
    if engine.optimizer is None and not owner.partitions_params:
        masters_from_module(engine, Layout(owner.checkpoint_layout(param_names(engine.module))))
        return
    owner.after_checkpoint_load()


@torch.no_grad()
def masters_from_module(engine, layout):
    """load_module_only: refresh the masters from the (just loaded) model weights."""
    params = dict(engine.module.named_parameters())
    visitor = states_visitor(engine, writes=True)
    try:
        for r in layout.records:
            if visitor is not None:
                visitor.use(r.opt_param)
            src = params[r.name].detach().reshape(-1)[r.start:r.stop]
            dst = r.opt_param.view(-1)[r.opt_offset:r.opt_offset + r.stop - r.start]
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
    finally:
        if visitor is not None:
            visitor.close()


def states_visitor(engine, writes):
    """The owner's visitor of its units' states (states on NVMe: one unit at a time in memory), or None."""
    return engine.state_owner.states_visitor(writes)
