"""Stages 0-1's gradients: torch's `param.grad` semantics over flat resident buckets (grad_buffers.py), each bucket
reduced in place (reducer.py) as soon as its last gradient arrived in a reducing backward, through the one intake
(grad_intake.py). Stage 0 all-reduces each bucket; stage 1 (`chunks`: each bucket's slice of this rank)
reduce-scatters it in place. post_reduce_factor (1/world for a SUM reduction) is what the reduced gradients must be
multiplied by; the step folds it into its single unscale/clip pass.
"""
from .buckets import ResidentBucket
from .intake import GradIntake
from .reducer import reducer_for


def build_grad_sync(buffers, world, rank, group=None, shared=None, chunks=None, landed=None):
    """The intake of stage 0 (chunks None) or 1 over `buffers`; `shared`: the shm_reduce.SharedTable the buffers
    were allocated from (same-host CPU ranks), if any; landed(bucket): a bucket holds the window's reduced sum (the owner's copy to the host, its norms)."""
    table = shared.table if shared is not None and buffers.storage is not None else None
    index = {id(p): i for i, p in enumerate(buffers.params)}
    buckets = [ResidentBucket(b, [(index[id(p)], (buffers.offset_of[id(p)], p.numel())) for p in b.params],
                              chunks[b.index] if chunks is not None else None) for b in buffers.buckets]
    reducer = reducer_for(buckets, world, rank, group, table=table)
    return GradIntake(buffers.params, reducer, world, buffers=buffers, chunks=chunks, landed=landed)
