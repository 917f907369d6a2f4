"""The one place a ZeRO stage picks its state owner (what every owner offers is state_owner.StateOwner).

    owner = build_owner(cfg, model, trainable, groups, bucket, dp, device)

stage 0 replicated.Replicated (precision strategy + all-reduce), stages 1-2 sharded.py, stage 3 stage3.py. The
engine and initialize() then talk to the owner through state_owner.StateOwner only; the optimizer is built over
owner.optimizer_groups(groups) on owner.optimizer_device (the fp32 masters at stage 0, this rank's flat shards at
ZeRO stages, on the host with offload_optimizer), and a client optimizer is re-pointed by
owner.adopt_client_optimizer.
"""
import torch

from ..config.master_precision import master_dtype_name
from ..utils.z3_leaf_module import apply_zero_leaf_module_config
from .grads.sync import build_grad_sync
from .owners.master_copies import build_master_copies
from .policy.placement import placement_of
from .policy.precision import precision_policy
from .owners.replicated import Replicated
from .owners.sharded import build_sharded_owner
from .transport.shm import shm_allocator
from .owners.stage3 import build_stage3_owner


def build_owner(cfg, model, trainable, groups, bucket, dp, device):
    """dp: the comm.data_parallel.DataParallel the engine trains over (its group, this rank, the world)."""
    owner = _build_owner(cfg, model, trainable, groups, bucket, dp, device)
    off = cfg.zero_optimization.offload_optimizer
    if off is not None and off.overlap_step and cfg.zero_stage in (1, 2, 3):   # (config/overlap_step.py checked)
        owner.overlap_on(model)
    return owner


def _build_owner(cfg, model, trainable, groups, bucket, dp, device):
    group_of = group_index(groups, trainable)
    world, rank, group = dp.world, dp.rank, dp.group
    device = torch.device(device or "cpu")
    placement = placement_of(cfg.zero_optimization, device, aio=cfg.aio)
    policy = precision_policy(cfg.precision, cfg.zero_stage, cfg.communication_data_type,
                              master=master_dtype_name(cfg), states_16bit=cfg.bf16.bf16_optimizer_states)
    apply_zero_leaf_module_config(model, cfg.zero_optimization.leaf_module)   # (flags; stage 3 acts on them)
    if cfg.zero_stage == 3:
        return build_stage3_owner(model, trainable, group_of, policy, world, rank, placement,
                                  cfg.zero_optimization, group=group)
    if cfg.zero_stage == 0:
        shared = shm_allocator(world, group) if trainable and dp.distributed else None
        copies = build_master_copies(policy, model, trainable, bucket, allocate=shared)
        return Replicated(policy, copies, build_grad_sync(copies.buffers, world, rank, group, shared))
    shared = (lambda: shm_allocator(world, group)) if trainable and dp.distributed else None
    return build_sharded_owner(cfg.zero_stage, trainable, group_of, policy, bucket, world, rank, placement,
                               group=group, module=model, shared=shared)


def group_index(groups, params):
    """Param-group index of each param (0 when the groups are a plain list of params)."""
    if not (groups and isinstance(groups[0], dict)):
        return [0] * len(params)
    where = {id(p): gi for gi, g in enumerate(groups) for p in g["params"]}
    return [where[id(p)] for p in params]
