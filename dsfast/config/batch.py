"""Resolve train_batch_size / train_micro_batch_size_per_gpu / gradient_accumulation_steps (DeepSpeed's rules)."""
from __future__ import annotations

from typing import Optional, Tuple


class BatchSizeError(ValueError):
    pass


def resolve_batch_sizes(train: Optional[int], micro: Optional[int], gas: Optional[int],
                        world_size: int) -> Tuple[int, int, int]:
    """Return (train_batch_size, micro_batch_per_gpu, grad_accum_steps) with train == micro * gas * world_size.

    Any two given determine the third; train alone gives gas=1 and micro=train/world; micro alone gives gas=1.
    """
    if world_size < 1:
        raise BatchSizeError(f"world size must be >= 1 (got {world_size})")
    given = (train, micro, gas)
    if train is not None and micro is not None and gas is not None:
        pass
    elif train is not None and micro is not None:
        gas = train // micro // world_size
    elif train is not None and gas is not None:
        micro = train // world_size // gas
    elif micro is not None and gas is not None:
        train = micro * gas * world_size
    elif train is not None:
        gas, micro = 1, train // world_size
    elif micro is not None:
        gas, train = 1, micro * world_size
    else:
        raise BatchSizeError("set train_batch_size or train_micro_batch_size_per_gpu (or both): neither is given"
                             + (f" (gradient_accumulation_steps={gas} alone does not fix a batch size)"
                                if gas is not None else ""))
    if train != micro * gas * world_size or micro < 1 or gas < 1:
        names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
        shown = ", ".join(f"{n}={v if v is not None else 'not set'}" for n, v in zip(names, given))
        raise BatchSizeError(
            f"batch sizes do not fit the world size: {shown}, detected world size={world_size}; "
            "need train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size"
            f" (here {micro} * {gas} * {world_size} = {micro * gas * world_size}"
            f"{'' if train == micro * gas * world_size else f' != {train}'})")
    return train, micro, gas
