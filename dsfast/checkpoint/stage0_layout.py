"""The engine <-> checkpoint contract: which slices of which parameters this rank's optimizer holds.

checkpoint_layout(engine) -> Layout(records, replicated, stage, world_size); each SliceRecord says that elements
[start, stop) of the flattened parameter `name` live at opt_param.view(-1)[opt_offset: opt_offset + stop - start],
where opt_param is the key of engine.optimizer.state (its values are the fp32 master). engine_after_load(engine)
writes the loaded masters back into the model. An engine whose state owner provides these
(`engine._owner.checkpoint_layout()` / `after_checkpoint_load()`, the ZeRO stages) is asked; otherwise the
stage-0 form is built here from engine._precision and engine.optimizer: one record per trainable parameter.
"""
from dataclasses import dataclass, field
from typing import List, Tuple

import torch


@dataclass
class SliceRecord:
    name: str
    shape: Tuple[int, ...]
    start: int
    stop: int
    opt_param: torch.Tensor
    opt_offset: int = 0


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
    owner = getattr(engine, "_owner", None)
    if owner is not None and hasattr(owner, "checkpoint_layout"):
        return owner.checkpoint_layout()
    names = param_names(engine.module)
    records = []
    optimized = set()
    if engine.optimizer is not None:
        optimized = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    for p in engine._precision.params:
        master = engine._precision.master_of(p)
        if id(master) not in optimized:
            continue
        records.append(SliceRecord(names[id(p)], tuple(p.shape), 0, p.numel(), master, 0))
    return Layout(records, replicated=True, stage=int(getattr(engine.config, "zero_stage", 0)),
                  world_size=int(engine.world_size))


@torch.no_grad()
def engine_after_load(engine):
    """Loaded fp32 masters -> the model's (half-precision) parameters; nothing to do when they are the same."""
    owner = getattr(engine, "_owner", None)
    if owner is not None and hasattr(owner, "after_checkpoint_load"):
        return owner.after_checkpoint_load()
    precision = engine._precision
    for p in precision.params:
        m = precision.master_of(p)
        if m is not p:
            p.copy_(m)


@torch.no_grad()
def masters_from_module(engine, layout):
    """load_module_only: refresh the masters from the (just loaded) model weights."""
    params = dict(engine.module.named_parameters())
    for r in layout.records:
        src = params[r.name].detach().reshape(-1)[r.start:r.stop]
        dst = r.opt_param.view(-1)[r.opt_offset:r.opt_offset + r.stop - r.start]
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src)
