"""What every ZeRO stage's state owner provides to the engine, checkpoints and dsfast.utils (StateOwner).

One owner per stage holds everything its stage partitions (flat buffers, fp32 masters, reduction, the step
decision and the update, write-back). The engine, initialize() and dsfast.checkpoint use only the StateOwner
protocol below, never an owner's other attributes. Stage 0 is replicated.Replicated; stages 1 and 2 sharded.py;
stage 3 stage3.py; what stages 1-3 share is shard_owner.ShardOwner; owners.py builds them (the one place that names
a stage). tests/test_owner_protocol.py runs every owner through this protocol.
"""
import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Dict, List, Optional, Protocol, Tuple

import torch

from .policy.precision import PrecisionPolicy


@dataclass(frozen=True)
class SliceRecord:
    """Where a piece of a parameter lives (the checkpoint manifest): elements [start, stop) of the flattened
    parameter are at opt_param.view(-1)[opt_offset : opt_offset + stop - start], and so are the same elements of
    every per-element optimizer state of opt_param."""
    name: str
    shape: tuple
    start: int
    stop: int
    opt_param: torch.Tensor
    opt_offset: int


class StateOwner(Protocol):
    """Every member is answered by every owner (OwnerDefaults gives the answer where a member does not apply), so
    callers never probe an owner with getattr/hasattr."""
    stage: int                      # the ZeRO stage (0-3), for messages and DeepSpeed's queries
    precision: PrecisionPolicy      # .name (fp32 | fp16 | bf16), .dtype (None for fp32), param/reduce/master dtypes
    post_reduce_factor: float       # what reduced gradients are multiplied by (1/world for a SUM reduction)
    partitions_params: bool         # no rank holds whole parameters between uses (stage 3)
    reduces_every_micro_step: bool  # gradients are reduced at every backward (stages 2-3): no no_sync()
    trains: bool                    # something to optimize
    reducer: object                 # reducer.Reducer: .transport (local | gloo | shm), .collectives_launched
    collectives_launched: int       # the reducer's count (what the equivalence tests compare across stages)
    gathers_through: Optional[str]  # how parameters are gathered: "collectives" | "shm" (stage 3), None below it
    units: List[object]             # this rank's shard units (units/shard_unit.ShardUnit: one a bucket, at stage 3
    #                                 one a trained parameter) in the optimizer's order; [] at stage 0 (none)

    # NVMe: where the optimizer's units (masters and states) and stage 3's parameter shards are swapped
    swap: Optional[object]          # nvme_states.NvmeStates (offload_optimizer on NVMe), else None
    param_swap: Optional[object]    # nvme_params.NvmeParams (offload_param on NVMe, stage 3), else None
    swaps: List[object]             # the ones in use, [] without NVMe: what the engine reports and closes

    # the optimizer: built over optimizer_groups(groups) on optimizer_device (None: the engine's device)
    optimizer_device: Optional[torch.device]
    def optimizer_groups(self, groups): ...
    def adopt_client_optimizer(self, optimizer, groups) -> None: ...
    def bind_optimizer(self, optimizer) -> None: ...

    # a training step
    def begin_backward(self, reduce: bool) -> None: ...
    def end_backward(self) -> None: ...
    def prepare_step(self, names: Dict[int, str]) -> None: ...   # adopt zero_grad()s, refuse stray gradients
    def step(self, optimizer, factor: float, clip: float, check_overflow: bool) -> Tuple[bool, object]: ...
    def zero_grads(self) -> None: ...

    # checkpoints, dsfast.utils, memory
    def checkpoint_layout(self, names: Dict[int, str]) -> List["SliceRecord"]: ...   # every trained param once
    def module_slices(self, names: Dict[int, str], exclude_frozen: bool = False,
                      values: bool = True) -> List["SliceRecord"]: ...   # this rank's slices of partitioned
    #                                                                     params ([] when none is partitioned)
    def states_visitor(self, writes: bool) -> Optional[object]: ...   # NVMe: visitor.use(shard) / .close()
    def visiting(self, writes: bool) -> ContextManager[Callable]: ...   # `with ... as use:` use(opt_param)
    def after_checkpoint_load(self) -> None: ...
    def shard_changed(self, param) -> None: ...   # a partitioned param's shard was written: the master follows
    def full_fp32_param(self, param) -> torch.Tensor: ...        # collectives at ZeRO stages
    def full_grad(self, param) -> torch.Tensor: ...
    def full_optimizer_state(self, param, key: str) -> torch.Tensor: ...
    def local_fp32_param(self, param) -> torch.Tensor: ...       # this rank's piece (1-D at ZeRO stages)
    def local_grad(self, param) -> torch.Tensor: ...
    def local_optimizer_state(self, param, key: str) -> torch.Tensor: ...
    def set_full_fp32_param(self, param, value) -> None: ...     # no collective: each rank writes its piece;
    def set_full_grad(self, param, value) -> None: ...           # set_local_* take exactly this rank's piece
    def set_full_optimizer_state(self, param, value, key: str) -> None: ...
    def memory_tensors(self) -> Dict[str, List[torch.Tensor]]: ...
    def empty_partition_cache(self) -> None: ...             # stage 3: release what stays gathered
    def settle(self, agree: bool = False) -> None: ...   # offload_optimizer.overlap_step: the step in its worker
    #                                     done before anything reads or writes parameters or states; a failure
    #                                     there raised (agree=True: on every rank, where every rank calls it)
    def detach(self) -> None: ...


class OwnerDefaults:
    """The protocol's answers where a member does not apply to an owner (no NVMe, no partitioned parameters)."""
    partitions_params = False
    reduces_every_micro_step = False
    gathers_through = None
    swap = None
    param_swap = None

    @property
    def units(self):
        """Whole parameters, no shard units."""
        return []

    @property
    def swaps(self):
        return [s for s in (self.swap, self.param_swap) if s is not None]

    @property
    def collectives_launched(self):
        return self.reducer.collectives_launched

    def states_visitor(self, writes):
        """With states on NVMe, a nvme_states.Visitor: visitor.use(shard) before touching a unit's master or
        optimizer states (one unit at a time in host memory), visitor.close() after; writes=False when nothing is
        changed. None otherwise (every state is in memory)."""
        return self.swap.visitor(writes) if self.swap is not None else None

    @contextlib.contextmanager
    def visiting(self, writes):
        """`with owner.visiting(writes) as use:` use(shard) before touching that unit's states (states_visitor)."""
        visitor = self.states_visitor(writes)
        try:
            yield visitor.use if visitor is not None else (lambda shard: None)
        finally:
            if visitor is not None:
                visitor.close()

    def module_slices(self, names, exclude_frozen=False, values=True):
        """Every rank holds whole parameters (rank 0 saves them): no slices."""
        return []

    def shard_changed(self, param):
        """Only partitioned parameters have shards written behind the owner's back."""

    def empty_partition_cache(self):
        """Nothing stays gathered: every rank holds whole parameters."""

    def settle(self, agree=False):
        """The step ran on the main thread: nothing is in flight."""


def memory_breakdown(categories):
    """{category: {device: bytes}} plus {"total": {device: bytes}}, counted from the tensors themselves (their own
    elements: a rank's row of a shared-memory table counts, the other ranks' rows do not). A tensor listed twice
    is counted once, in the first category that holds it."""
    seen = set()
    out, total = {}, {}
    for cat, tensors in categories.items():
        per = out.setdefault(cat, {})
        for t in tensors:
            if t is None or not torch.is_tensor(t):
                continue
            # its own elements, but no more than its storage still holds (a released stage-3 parameter keeps its
            # shape over a storage resized to nothing)
            held = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
            nbytes = max(0, min(t.numel() * t.element_size(), held))
            key = (t.data_ptr(), nbytes, t.device)
            if key in seen or nbytes == 0:
                continue
            seen.add(key)
            dev = "host" if t.device.type == "cpu" else str(t.device)
            per[dev] = per.get(dev, 0) + nbytes
            total[dev] = total.get(dev, 0) + nbytes
    out["total"] = total
    return out
