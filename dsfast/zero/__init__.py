"""ZeRO: partitioned optimizer states (stage 1), gradients (stage 2) and parameters (stage 3), with CPU offload.

Laid out as its architecture, in layers, lowest first (tests/test_import_rules.py holds every import to it):
  transport/  transports.py (one rank, c10d, the /dev/shm table of shm.py: allocate, reduce, all-gather), what
              grads/, units/ and params/ send through
  policy/     pure data: partition.py (bucket plans, each rank's slices, the memory formulas), placement.py (where a
              unit's tensors live: device / host / pinned / NVMe), precision.py (param / reduce / master dtypes)
  nvme/       NVMe offload: states.py (the units' masters and states in swap files, stepped through a window),
              params.py (stage 3's shards in swap files), window.py, space.py, io.py (O_DIRECT reads and writes as
              futures), buffers.py, files.py (one locked swap directory per job and rank), checks.py
  step/       decide.py (overflow, global norm, clip coefficient: one all-reduce, every stage), clip_arith.py
              (DeepSpeed 0.19.8's arithmetic), apply.py (the units walked through the optimizer's per-unit entry)
  units/      shard_unit.py (one bucket's slice, master, optimizer shard, gradient, host copies, residency and
              readiness), flat_shards.py (the parameter buckets and units of stages 1-2)
  params/     stage 3's parameters: partitioned_param.py (one rank's slice, gathered whole only while used), hooks.py
              (gather around forward / backward, external parameters, leaf modules), prefetch.py, gather_order.py,
              leaf_granularity.py, shared.py (same-host shards in one /dev/shm table), placeholders.py, save16.py,
              init.py (zero.Init), gathered.py (GatheredParameters), ds_methods.py (param.all_gather & co),
              unwrap_generation.py (unwrap_model_for_generation)
  grads/      the gradients of every stage: intake.py (hooks, boundary, late and stray gradients, the offload copy),
              buckets.py (what a bucket holds: resident at stages 0-1, staged at 2-3), buffers.py (stages 0-1's flat
              buckets), sync.py (stages 0-1's param.grad semantics), reducer.py (buckets reduced in order as they
              complete)
  owner.py    StateOwner: the protocol every owner answers (OwnerDefaults where a member does not apply)
  owners/     one file per owner: replicated.py (stage 0) with master_copies.py, shard_owner.py (what stages 1-3
              share), sharded.py (stages 1-2), stage3.py; set_values.py (the safe_set_* value check)
  build.py    build_owner: the one place that names a stage and builds its owner
  planning/   estimate.py (model-state memory per rank; a CLI), plan.py (`dsfast plan`), host_figures.py,
              model_count.py, auto_offload.py (offload_optimizer.device "auto")
"""
from .policy.partition import model_state_bytes


# DeepSpeed's deepspeed.zero names for what dsfast does not do
_NOT_SUPPORTED = {
    "MiCS_Init": "MiCS, ZeRO-3 sharded within groups of ranks; use deepspeed.zero.Init",
    "TiledLinear": "splitting a Linear layer into tiles gathered one at a time; use torch.nn.Linear",
    "TiledLinearReturnBias": "splitting a Linear layer into tiles gathered one at a time; use torch.nn.Linear",
}


def __getattr__(name):
    # the stage 3 API loads on first use (DeepSpeed's names: deepspeed.zero.Init, GatheredParameters, ...)
    import importlib
    where = {"GatheredParameters": ".params.gathered", "Init": ".params.init",
             "register_external_parameter": ".params.hooks", "unregister_external_parameter": ".params.hooks",
             "estimate_model_states": ".planning.estimate", "ZeroParamStatus": ".params.partitioned_param",
             "ZeroParamType": ".params.partitioned_param"}
    if name in _NOT_SUPPORTED:   # hasattr() stays False; a program that uses one is told what it is and why
        raise AttributeError(f"deepspeed.zero.{name} ({_NOT_SUPPORTED[name]}) is not supported by dsfast")
    if name not in where:
        raise AttributeError(f"module 'dsfast.zero' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[name], __name__), name)
    globals()[name] = value
    return value


__all__ = ["model_state_bytes", "GatheredParameters", "Init", "register_external_parameter",
           "unregister_external_parameter",
           "estimate_model_states", "ZeroParamStatus", "ZeroParamType"]
