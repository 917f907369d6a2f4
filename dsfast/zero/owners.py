"""The one place a ZeRO stage picks its state owner, and what every owner offers the optimizer.

    owner = build_owner(cfg, model, trainable, groups, bucket, dp, device)

stage 0 replicated.Replicated (precision strategy + all-reduce), stages 1-2 sharded.py, stage 3 stage3.py. The
engine and initialize() then talk to the owner through state_owner.StateOwner only; the optimizer is built over
owner.optimizer_groups(groups) on owner.optimizer_device (the fp32 masters at stage 0, this rank's flat shards at
ZeRO stages, on the host with offload_optimizer), and a client optimizer is re-pointed by
owner.adopt_client_optimizer.
"""
import contextlib

import torch

from ..config.master_precision import master_dtype_name
from ..utils.z3_leaf_module import apply_zero_leaf_module_config
from .placement import placement_of
from .precision import precision_policy
from .shm_reduce import shm_allocator


def build_owner(cfg, model, trainable, groups, bucket, dp, device):
    """dp: the comm.data_parallel.DataParallel the engine trains over (its group, this rank, the world)."""
    group_of = group_index(groups, trainable)
    world, rank, group = dp.world, dp.rank, dp.group
    device = torch.device(device or "cpu")
    placement = placement_of(cfg.zero_optimization, device, aio=cfg.aio)
    policy = precision_policy(cfg.precision, cfg.zero_stage, cfg.communication_data_type,
                              master=master_dtype_name(cfg), states_16bit=cfg.bf16.bf16_optimizer_states)
    apply_zero_leaf_module_config(model, cfg.zero_optimization.leaf_module)   # (flags; stage 3 acts on them)
    if cfg.zero_stage == 3:
        from .stage3 import build_stage3_owner
        return build_stage3_owner(model, trainable, group_of, policy, world, rank, placement,
                                  cfg.zero_optimization, group=group)
    if cfg.zero_stage == 0:
        from .grad_sync import build_grad_sync
        from .mixed_precision import build_precision
        from .replicated import Replicated
        shared = shm_allocator(world, group) if trainable and dp.distributed else None
        precision = build_precision(cfg.precision, model, trainable, bucket, allocate=shared)
        return Replicated(precision, build_grad_sync(precision.buffers, world, rank, group, shared))
    from .sharded import build_sharded_owner
    shared = (lambda: shm_allocator(world, group)) if trainable and dp.distributed else None
    return build_sharded_owner(cfg.zero_stage, trainable, group_of, policy, bucket, world, rank, placement,
                               group=group, module=model, shared=shared)


def group_index(groups, params):
    """Param-group index of each param (0 when the groups are a plain list of params)."""
    if not (groups and isinstance(groups[0], dict)):
        return [0] * len(params)
    where = {id(p): gi for gi, g in enumerate(groups) for p in g["params"]}
    return [where[id(p)] for p in params]


def hyperparameters(groups):
    """Each param group without its params (one {} for a plain list)."""
    if groups and isinstance(groups[0], dict):
        return [{k: v for k, v in g.items() if k != "params"} for g in groups]
    return [{}]


class ShardOptimizer:
    """What the ZeRO owners (stages 1-3) share towards the optimizer: it steps this rank's flat shards."""

    def empty_partition_cache(self):
        """Nothing is gathered outside a forward below stage 3."""

    @property
    def swap(self):
        """The NVMe placement of the units' states (nvme_states.NvmeStates), or None."""
        return getattr(self.store, "swap", None)

    @property
    def param_swap(self):
        """Stage 3's parameter shards on NVMe (nvme_params.NvmeParams), or None."""
        return getattr(self.store, "param_swap", None)

    @property
    def swaps(self):
        """The NVMe swaps in use (states, parameters): what the engine reports and closes."""
        return [s for s in (self.swap, self.param_swap) if s is not None]

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

    @property
    def trains(self):
        return bool(self.store.params)

    @property
    def optimizer_device(self):
        return self.store.master_device

    def optimizer_groups(self, groups):
        """One group per user group over this rank's shard units, its hyperparameters kept; every group is kept,
        empty or not, so the user's group indices (and per-group schedules) still line up."""
        out = [dict(h, params=[]) for h in hyperparameters(groups)]
        for u in self.store.units:
            out[u.plan.group]["params"].append(u.shard)
        return out

    def adopt_client_optimizer(self, optimizer, groups):
        """A client optimizer built on the model's params steps the flat shards instead (a fresh one only)."""
        if len(optimizer.state):
            raise ValueError(f"the client optimizer ({type(optimizer).__name__}) already has state; under ZeRO "
                             f"stage {self.stage} it steps flat partitions, so pass an optimizer that has not "
                             "stepped yet")
        for g, s in zip(optimizer.param_groups, self.optimizer_groups(groups)):
            g["params"] = s["params"]
