"""What every ZeRO stage's state owner provides to the engine, checkpoints and dsfast.utils (StateOwner).

One owner per stage holds everything its stage partitions (flat buffers, fp32 masters, reduction, the step
decision and the update, write-back). The engine, initialize() and dsfast.checkpoint use only the StateOwner
protocol below. Stage 0 is replicated.Replicated; stages 1 and 2 sharded.py; stage 3 stage3.py (owners.py builds
them).
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Protocol, Tuple

import torch


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
    stage: int                      # the ZeRO stage (0-3), for messages and DeepSpeed's queries
    precision: object               # .name (fp32 | fp16 | bf16), .dtype (None for fp32): precision.PrecisionPolicy
    post_reduce_factor: float       # what reduced gradients are multiplied by (1/world for a SUM reduction)
    partitions_params: bool         # no rank holds whole parameters between uses (stage 3)
    trains: bool                    # something to optimize
    reducer: object                 # reducer.Reducer: .transport (local | gloo | shm), .collectives_launched

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
    def checkpoint_layout(self, names: Dict[int, str]) -> List["SliceRecord"]: ...
    def after_checkpoint_load(self) -> None: ...
    def full_fp32_param(self, param) -> torch.Tensor: ...        # collectives at ZeRO stages; local_* variants
    def full_grad(self, param) -> torch.Tensor: ...
    def full_optimizer_state(self, param, key: str) -> torch.Tensor: ...
    def set_full_fp32_param(self, param, value) -> None: ...     # no collective: each rank writes its piece;
    def set_full_grad(self, param, value) -> None: ...           # set_local_* take exactly this rank's piece
    def set_full_optimizer_state(self, param, value, key: str) -> None: ...
    def memory_tensors(self) -> Dict[str, List[torch.Tensor]]: ...
    def empty_partition_cache(self) -> None: ...             # stage 3: release what stays gathered
    def detach(self) -> None: ...


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
