"""ZeRO: partitioned optimizer states (stage 1) and gradients (stage 2), with optional CPU offload.

Files, one job each:
  partition.py    pure partition maths (bucket plans, each rank's slices, the model-state memory formulas)
  flat_shards.py  parameter buckets and each rank's fp32 master shards (the storage stages 1-2 share)
  shard_step.py   global norm across ranks, clip, overflow skip, the update of the shards, write-back
  sharded.py      the stage 1 and stage 2 state owners (reduce-scatter during backward)
"""
from .partition import model_state_bytes

__all__ = ["model_state_bytes"]
