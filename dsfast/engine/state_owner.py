"""What every ZeRO stage's state owner provides to the engine, checkpoints and dsfast.utils.

One owner per stage holds everything its stage partitions (flat buffers, fp32 masters, reduction, the global
norm and overflow check, the update and write-back). The engine calls only:
    precision                       DtypePolicy-like: .name (fp32 | fp16 | bf16), .dtype (None for fp32)
    post_reduce_factor              what reduced gradients are multiplied by (1/world for a SUM reduction)
    begin_backward(reduce) / end_backward()
    prepare_step(names)             adopt the user's zero_grad()s, refuse gradients no engine.backward produced
    step(optimizer, factor, clip, check_overflow) -> (applied, norm)
    zero_grads()                    after the step
    bind_optimizer(optimizer)
    memory_tensors() -> {category: [tensors]}           (engine.memory_breakdown counts them)
    checkpoint_layout(names) -> [SliceRecord]; after_checkpoint_load()
    full_fp32_param / full_grad / full_optimizer_state (collectives at ZeRO stages) and local_* variants
    detach()
Stage 0 is replicated.Replicated; stages 1 and 2 are dsfast.zero.sharded.
"""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DtypePolicy:
    name: str                 # fp32 | fp16 | bf16
    dtype: object             # the model's dtype, or None for fp32


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
