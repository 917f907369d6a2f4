"""ZeRO: partitioned optimizer states (stage 1), gradients (stage 2) and parameters (stage 3), with CPU offload.

Files, one job each:
  state_owner.py       StateOwner: what every stage's owner provides the engine and checkpoints (its defaults:
                       OwnerDefaults); memory counting
  owners.py            build_owner: the one place a stage picks its owner (nothing imports it back)
  shard_owner.py       what the owners of stages 1-3 share: the optimizer steps this rank's shard units
  placement.py         where a unit's tensors live (device / host / pinned / NVMe; the distinct-host test placement)
  precision.py         the param / reduce / master dtypes (communication_data_type, 16-bit masters)
  shard_unit.py        one bucket's slice, master, optimizer shard, gradient and host copies, in one object
  replicated.py        stage 0's owner: every rank holds everything (master copies + all-reduce)
  mixed_precision.py   stage 0's master copies for fp32 / fp16 / bf16 (fp32 masters, where the 16-bit copies go)
  grad_buffers.py      flat gradient buckets (param.grad are slices of them in fp32) of stages 0 and 1
  grad_intake.py       every stage's one gradient intake: hooks, backward / boundary flags, late gradients (a layer
                       reused inside a reentrant checkpoint), stray gradients, the offload copy as a bucket is reduced
  grad_sync.py         stages 0-1: those buckets as resident buckets over the reducer, through the intake
  grad_buckets.py      every stage's gradient bucket layouts: resident (stages 0-1, reduced in place), staged
                       (stages 2-3, reduce-scattered into the units' gradient shards)
  reducer.py           the one gradient reduction: buckets in order as they complete, over one transport
  transports.py        the transports: one rank, c10d collectives, or the same-host /dev/shm table
  shm_reduce.py        the same-host /dev/shm table the reductions and stage 3's gathers go through
  partition.py         pure partition maths (bucket plans, each rank's slices, the model-state memory formulas)
  flat_shards.py       parameter buckets and their shard units (the storage stages 1-2 share)
  decide.py            every stage's step decision: overflow (element-wise), global norm, clip coefficient
  shard_step.py        the update of the units through the optimizer contract (optim/amp_step.py)
  sharded.py           the stage 1 and stage 2 state owners (reduce-scatter during backward)
  partitioned_param.py stage 3: one rank's slice of each parameter, gathered whole only while used
  param_hooks.py       stage 3: module hooks that gather around forward / backward, external parameters, leaf modules
  leaf_granularity.py  stage 3: leaf modules chosen by size (stage3_module_granularity_threshold)
  gather_order.py      stage 3: every rank all-gathered the same parameters (checked at the end of each backward)
  placeholders.py      stage 3: what state_dict() holds for a partitioned parameter (saves with a warning, never loads)
  stage3.py            the stage 3 state owner (gradients reduced in buckets, step on the shards)
  shared_params.py     stage 3, same-host CPU ranks: the parameter shards published in one /dev/shm table
  gathered.py          GatheredParameters (whole parameters inside a `with` block)
  init.py              Init (partition each module as it is built)
  estimate.py          model-state memory per rank for every stage and offload choice (also a CLI)
 NVMe offload of the optimizer states (offload_optimizer.device = nvme):
  nvme_states.py       the units' masters and states in swap files, stepped through a window (the placement)
  nvme_window.py       prefetch / acquire / release of units over buffer_count host buffers
  nvme_io.py           O_DIRECT (or buffered) whole-file reads and writes from a thread pool, as futures
  nvme_buffers.py      page-aligned host buffers of exact size (pinned by registering, with a GPU)
  nvme_files.py        one locked swap directory per job and rank; stale ones of killed jobs removed
  nvme_checks.py       the start-up checks: nvme_path, free bytes, host memory, ulimit -l, /dev/shm, tmpfs
"""
from .partition import model_state_bytes


def __getattr__(name):
    # the stage 3 API loads on first use (DeepSpeed's names: deepspeed.zero.Init, GatheredParameters, ...)
    import importlib
    where = {"GatheredParameters": ".gathered", "Init": ".init", "register_external_parameter": ".param_hooks",
             "unregister_external_parameter": ".param_hooks",
             "estimate_model_states": ".estimate", "ZeroParamStatus": ".partitioned_param",
             "ZeroParamType": ".partitioned_param"}
    if name not in where:
        raise AttributeError(f"module 'dsfast.zero' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[name], __name__), name)
    globals()[name] = value
    return value


__all__ = ["model_state_bytes", "GatheredParameters", "Init", "register_external_parameter",
           "unregister_external_parameter",
           "estimate_model_states", "ZeroParamStatus", "ZeroParamType"]
