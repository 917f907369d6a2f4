"""The state owners of ZeRO stages 1 and 2 (the engine only sequences them; see engine.py).

  ShardedOptimizerState  stage 1: full gradient buckets in the reduce dtype (param.grad are views of them when that
                         is the model's); at the accumulation boundary each bucket is reduce-scattered in place as
                         soon as it is complete (overlapping backward), so a rank's gradient shard is its slice.
  ShardedGradients       stage 2: no full gradient is kept. Each backward's gradients go through stage 3's bucketed
                         reduction (grad_buckets.py: gloo, /dev/shm or one rank) into this rank's gradient shards,
                         which accumulate across micro-steps, as DeepSpeed's do.
Both own the parameter buckets and fp32 master shards (flat_shards.FlatShards); the step is every stage's: the
decision across ranks (decide.py), the update of the shards (shard_step.py), then the all-gather.
"""
import os

import torch
import torch.distributed as dist

from ...comm.where import wait_now
from ...optim.quant_state import FLOAT_KEYS, QuantizedMoment, is_quantized
from ..grads import buckets as grad_buckets
from ..step.decide import decide
from ..step.landed_norms import LandedNorms
from ..units.flat_shards import FlatShards
from ..units.shard_unit import copy_on_lane
from ..grads.buffers import GradBuffers
from ..grads.intake import GradIntake
from ..grads.sync import build_grad_sync
from ..nvme.checks import check_host_states
from ..nvme.states import agreed_swap_errors, check_unit_by_unit
from ..policy.precision import PrecisionPolicy
from ..grads.reducer import reducer_for
from .shard_owner import ShardOwner
from ..step.apply import step_shards
from ..step.overlap import OverlappedStep, per_unit_optimizer_names
from ...optim.element_wise import is_element_wise
from .set_values import checked_value
from ..owner import SliceRecord


def local_ranks():
    """Ranks on this host (the launcher's and torchrun's LOCAL_WORLD_SIZE; 1 when unknown)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _unscaled(value, post_reduce_factor):
    """A gradient as the getters return it, back to what the owners hold (the sum over ranks)."""
    return value / post_reduce_factor if torch.is_tensor(value) and post_reduce_factor != 1 else value


class ShardedBase(ShardOwner):
    stage = None

    def __init__(self, store: FlatShards, precision: PrecisionPolicy, group=None):
        self.store = store
        self.precision = precision
        self.group = group
        self.world, self.rank = store.world, store.rank
        self.post_reduce_factor = 1.0 / self.world
        self.landed_norms = LandedNorms(store, self.stage)
        for p in store.params:
            p._dsfast_owner = self

    # ---- the optimizer step -------------------------------------------------------------------------------
    def host_grads_current(self):
        """Stages 2-3: the reduction's completion copied the gradients to the host already (offload)."""
        return True

    def grad_shards(self):
        return [u.grad for u in self.store.units]


    def step(self, optimizer, factor, clip, check_overflow):
        """(applied, norm). factor: 1/world x 1/loss_scale; the grads stay for zero_grads() to clear. The decision
        is global (one all-reduce), so every rank skips or all-gathers alike."""
        groups = 1 + max((u.plan.group for u in self.store.units), default=0)
        # (param group, piece) of each parameter part this rank owns, in DeepSpeed's order (group, parameter,
        # position): what DeepSpeed takes its per-tensor norms of (clip_arith.py); their norms taken as they landed
        keyed = self.landed_norms.keyed()
        self.landed_norms.wanted = clip > 0 or check_overflow
        decision = decide(self.grad_shards(), factor, clip, check_overflow, self.world, self.group,
                          device=self.store.device, pieces=[(key[0], t) for key, t in keyed], stage=self.stage,
                          groups=groups, norms=self.landed_norms.for_step(keyed))
        self.host_copies()
        if self.overlap is not None:   # the update runs in a worker; this returns at once (step/overlap.py)
            return self._submit_step(optimizer, decision), decision.norm
        with agreed_swap_errors(self.swaps, self.world, self.rank, self.group):
            step_shards(self.store, optimizer, decision)
        # the serial step: every unit's 16-bit values are back on the device before the all-gather publishes
        # them and before step() returns (the uploads ran on the h2d lane, one event per unit)
        self.store.wait_uploads()
        applied = decision.applied()
        if applied:
            self.store.all_gather(self.group)
        if self.param_swap is not None:   # the next pass reads the shards in this one's order
            self.param_swap.new_pass()
        return applied, decision.norm

    # ---- offload_optimizer.overlap_step: the host step behind the next forward (step/overlap.py) -------------
    overlap = None           # step/overlap.OverlappedStep when the key is on
    _refresh_pending = False   # stage 3: parameters kept whole still to be gathered again after a step

    def overlap_on(self, model):
        """Step in a worker from now on; the module hooks wait for the units a forward uses (a collective at
        stages 1-2 with several ranks: their gather group)."""
        self.overlap = OverlappedStep(self.store, self.world, self.rank, self.group)
        if not self.partitions_params:   # (stage 3 waits before each gather of a shard: partitioned_param.py)
            self.overlap.make_gather_group()
        self.overlap.hook(model, self._unit_of, waits=not self.partitions_params,
                          before_forward=self._refresh_whole)

    def _unit_of(self, param):
        found = self.store.bucket_of.get(id(param))
        return self.store.units[found[0].index] if found is not None else None

    def _submit_step(self, optimizer, decision):
        applied = decision.applied()
        several = self.world > 1 and not self.partitions_params
        self.overlap.submit(optimizer, decision, gather=self._gather_unit if several else None,
                            first=self._whole_units())
        self._refresh_pending = applied and self.partitions_params
        if self.param_swap is not None:   # (an applied step's worker overwrites the first shards: no read ahead yet)
            self.param_swap.new_pass(read=not applied)
        return applied

    def _gather_unit(self, unit, group):
        """Stages 1-2: one bucket's updated slices to every rank (the worker, on its own group)."""
        self.store.all_gather(group, buckets=[unit.index])

    def _whole_units(self):
        """Stage 3: the units whose parameters are whole between uses (persistent ones): the step refreshes them."""
        if not self.partitions_params:
            return ()
        return [u for u, r in zip(self.store.units, self.store.records) if r.gathered]

    def _refresh_whole(self):
        """Stage 3, as a forward starts or at a settle: the parameters kept whole get their updated values (a
        collective on the main thread, every rank at the same point), once their units are stepped."""
        if not self._refresh_pending:
            return
        self._refresh_pending = False
        if self.store.shared is not None:   # /dev/shm publishes every shard at once (a gather waits its own unit)
            for u in self.store.units:
                self.overlap.wait_unit(u)
        self.store.all_gather(self.group)

    def settle(self, agree=False):
        """Every unit's overlapped step done (and its failure raised: agree=True, where every rank calls it,
        raises it on every rank)."""
        if self.overlap is not None:
            self.overlap.settle(agree)
            self._refresh_whole()

    def _before_zeroing_grads(self):
        """The gradients are zeroed right after step() returns: their host copies (copies' lanes, u.grad_event)
        must have read them, and where no host copy was made the worker reads them in place."""
        if self.overlap is None:
            return   # (the serial step waited for both)
        for u in self.store.units:
            u.grad_event.wait()
        if not self.store.placement.copies_states:
            self.overlap.wait_all()   # (a failure is raised by the next settle, where every rank agrees)

    def host_copies(self):
        """Offload to a distinct host: stage 1's gradient shards copied for the CPU optimizer at step time, where
        its reduction did not copy them (one rank, or gradients the user changed since)."""
        placement = self.store.placement
        if not placement.copies_states or self.host_grads_current():
            return
        for u in self.store.units:
            if u.host_grad is None:
                u.host_grad = placement.host_empty(u.grad.numel(), u.grad.dtype)
            self._grad_to_host(u)

    def _landed(self, bucket):
        """Stages 1-2: a bucket's reduction landed (intake.py): its unit's gradient to the host (offload, distinct
        host), its norms for the step's decision (landed_norms.py) and its states read ahead (NVMe)."""
        u = self.store.units[bucket.index]
        if self.store.placement.copies_states:
            self._grad_to_host(u)
        self.landed_norms.landed(u)
        if self.store.swap is not None:   # its states' read from NVMe starts while backward goes on
            self.store.swap.read_ahead(u)

    def _grad_to_host(self, u):
        """Offload to a distinct host: u's reduced gradient into its host copy on the device's d2h lane (a side
        stream: the compute stream goes on with backward); u.grad_event says when the step may read it. (A second
        copy of the same unit, after a late gradient, queues behind the first: the last one wins.)"""
        u.grad_event = copy_on_lane(self.store.lanes.device_lane("d2h"), u.host_grad, u.grad,
                                    f"gradient of unit {u.index} to the host")

    def update_grads(self):
        """The gradient shards the optimizer reads (their host copies where the placement made some)."""
        return [u.update_grad for u in self.store.units]

    def after_checkpoint_load(self):
        with self.visiting(writes=False) as use:
            self.store.write_back(use)
        self.store.all_gather(self.group)

    # ---- what checkpoints and dsfast.utils read -------------------------------------------------------------
    def checkpoint_layout(self, names):
        """SliceRecords of this rank's pieces; names: id(param) -> qualified name."""
        out = []
        for plan, shard in zip(self.store.plans, self.store.shards):
            for e, a, b, off in self.store.pieces(plan):
                p = self.store.params[e.param]
                out.append(SliceRecord(names[id(p)], tuple(self._shape_of(p)), a, b, shard, off))
        return out

    def _full(self, param, source):
        """The whole flattened param assembled from every rank's pieces (a collective: every rank calls it).
        source(bucket_index) -> this rank's 1-D shard tensor holding the values."""
        plan, e = self.store.bucket_of[id(param)]
        full = torch.zeros(e.numel, dtype=torch.float32, device=self.store.device)
        lo, _ = plan.shard_range(self.rank)
        a, b = max(lo, e.offset), min(lo + plan.shard, e.offset + e.numel)
        if a < b:
            with self.visiting(writes=False) as use:
                use(self.store.units[plan.index].shard)
                full[a - e.offset:b - e.offset].copy_(source(plan.index)[a - lo:b - lo])
        if self.world > 1:
            wait_now(dist.all_reduce(full, group=self.group, async_op=True), ("full parameter", [param]))
        return full.view(self._shape_of(param))

    def _shape_of(self, param):
        return param.shape

    def _local(self, param, source):
        plan, e = self.store.bucket_of[id(param)]
        lo, _ = plan.shard_range(self.rank)
        a, b = max(lo, e.offset), min(lo + plan.shard, e.offset + e.numel)
        if self.swap is None:
            return source(plan.index)[max(a - lo, 0):max(b - lo, 0)]
        with self.visiting(writes=False) as use:   # a copy: the swap takes the states' memory back after
            use(self.store.units[plan.index].shard)
            return source(plan.index)[max(a - lo, 0):max(b - lo, 0)].clone()

    def _state_dict(self, i, key):
        """The optimizer's state of shard i, or a KeyError naming the keys it has."""
        state = self._optimizer.state.get(self.store.shards[i], {}) if self._optimizer is not None else {}
        if key not in state and not (key in FLOAT_KEYS and is_quantized(state)):
            raise KeyError(f"optimizer state {key!r} does not exist (yet): available keys "
                           f"{sorted(state)}; states appear after the first optimizer step")
        return state

    def _state_of(self, key):
        def source(i):
            state = self._state_dict(i, key)
            if key not in state:   # 8-bit moments, as fp32 values (only the blocks a range touches)
                return QuantizedMoment(state, key)
            return state[key].float()
        return source

    def _state_tensor(self, i, key):
        """What a setter writes: the state itself, or its 8-bit moment's blocks (QuantizedMoment)."""
        state = self._state_dict(i, key)
        return state[key] if key in state else QuantizedMoment(state, key)

    def _grad_source(self, i):
        return self.grad_shards()[i].float() * self.post_reduce_factor

    _optimizer = None

    def bind_optimizer(self, optimizer):
        """The optimizer steps flat shards, so its own zero_grad() would clear nothing the user means: make it
        clear this owner's gradients too (what DeepSpeed's ZeRO optimizer's zero_grad() does)."""
        if self.swaps:
            try:
                check_unit_by_unit(optimizer, "offload_optimizer" if self.swap is not None else "offload_param")
            except ValueError:
                for swap in self.swaps:
                    swap.close()   # initialize fails: its swap files go now, not at the process's exit
                raise
        if self.overlap is not None and optimizer is not None and not (
                is_element_wise(optimizer) and hasattr(optimizer, "prepare_amp_step")):
            raise ValueError(f"zero_optimization.offload_optimizer.overlap_step: true steps the optimizer unit by "
                             f"unit in a worker, which needs an element-wise optimizer with dsfast's per-unit entry; "
                             f"{type(optimizer).__name__} is not one. Valid: dsfast's optimizers "
                             f"({', '.join(per_unit_optimizer_names())}) or the config's optimizer section; or "
                             "set overlap_step to false")
        if self.swap is not None:
            self.swap.optimizer = optimizer
        elif self.store.master_device.type == "cpu" and optimizer is not None and not len(optimizer.state):
            check_host_states(self.store.masters, optimizer, local_ranks())
        self._optimizer = optimizer
        if optimizer is None or getattr(optimizer, "_dsfast_clears", None) is self:
            return
        own = optimizer.zero_grad

        def zero_grad(set_to_none=True):
            own(set_to_none=set_to_none)
            self.clear_grads()
        optimizer.zero_grad = zero_grad
        optimizer._dsfast_clears = self

    # ---- gradients: the one intake (grad_intake.py) ----------------------------------------------------------
    _boundary = True   # this backward ends an accumulation window

    def begin_backward(self, reduce):
        self._boundary = reduce
        self.intake.begin_backward(reduce)

    def end_backward(self):
        self.intake.end_backward()

    def prepare_step(self, names):
        if self.overlap is not None:
            self.overlap.names = names
        self.intake.prepare_step(names)

    def detach(self):
        try:   # (engine.destroy(), on every rank: a failed overlapped step is raised on each, after the unhooking)
            self.settle(agree=True)
        finally:
            if self.overlap is not None:
                self.overlap.detach()
            self.intake.detach()
            self.store.close_lanes()

    def clear_grads(self):
        """Every gradient this rank holds for the model, gone (accumulated partitions and any param.grad)."""
        self.zero_grads()
        for p in self.store.params:
            p.grad = None

    def full_fp32_param(self, param):
        return self._full(param, lambda i: self.store.masters[i].float())

    def full_grad(self, param):
        return self._full(param, self._grad_source)

    def full_optimizer_state(self, param, key):
        return self._full(param, self._state_of(key))

    def local_fp32_param(self, param):
        return self._local(param, lambda i: self.store.masters[i])

    def local_grad(self, param):
        return self._local(param, self._grad_source)

    def local_optimizer_state(self, param, key):
        return self._local(param, self._state_of(key))

    # ---- what dsfast.utils' setters write: each rank its own piece, no collective (as DeepSpeed's) ------------
    def _targets(self, kind, key=None):
        """targets(bucket_index) -> the tensors holding this rank's shard of `kind` (a host copy of a gradient
        shard too, where offload keeps one, since the optimizer steps from it)."""
        if kind == "param":
            return lambda i: [self.store.masters[i]]
        if kind == "grad":
            return self._grad_targets
        return lambda i: [self._state_tensor(i, key)]

    def _grad_targets(self, i):
        unit = self.store.units[i]
        unit.grad_event.wait()   # a host copy still in flight would overwrite the new values with the old ones
        return [t for t in (self.grad_shards()[i], unit.host_grad) if t is not None]

    @torch.no_grad()
    def _set_piece(self, param, targets, value, local, api):
        """Write this rank's piece of `param` from `value`: the whole parameter's values, or (local) exactly
        this rank's piece, as the local getters return it."""
        plan, e = self.store.bucket_of[id(param)]
        lo, _ = plan.shard_range(self.rank)
        a, b = max(lo, e.offset), min(lo + plan.shard, e.offset + e.numel)
        if local:
            value = checked_value(value, max(b - a, 0), api, "local piece of this parameter on this rank")
            piece = value
        else:
            shape = tuple(self._shape_of(param))
            value = checked_value(value, e.numel, api, f"parameter of shape {shape}")
            piece = value[max(a - e.offset, 0):max(b - e.offset, 0)]
        if a >= b:
            return
        with self.visiting(writes=True) as use:
            use(self.store.units[plan.index].shard)
            for t in targets(plan.index):
                t[a - lo:b - lo] = piece   # (a tensor, or an 8-bit moment's QuantizedMoment)

    def set_full_fp32_param(self, param, value):
        if self.store.masters_are_params and not self.partitions_params:
            # the master is this rank's slice of the parameter itself: write the whole parameter, so that every
            # rank's copy of it stays the same
            value = checked_value(value, param.numel(), "safe_set_full_fp32_param",
                                  f"parameter of shape {tuple(param.shape)}")
            with torch.no_grad():
                param.data.copy_(value.view(param.shape))
            return
        self._set_piece(param, self._targets("param"), value, False, "safe_set_full_fp32_param")
        if self.store.masters_are_params and param.ds_status.name == "AVAILABLE":
            # stage 3, fp32: the shard is the master; a parameter whole right now (persistent) takes the value too
            with torch.no_grad():
                param.data.copy_(value.reshape(param.shape))

    def set_full_grad(self, param, value):
        # the shards hold the sum over ranks; the getters scale by post_reduce_factor
        self._set_piece(param, self._targets("grad"), _unscaled(value, self.post_reduce_factor), False,
                        "safe_set_full_grad")

    def set_full_optimizer_state(self, param, value, key):
        self._set_piece(param, self._targets("state", key), value, False, "safe_set_full_optimizer_state")

    def set_local_fp32_param(self, param, value):
        self._set_piece(param, self._targets("param"), value, True, "safe_set_local_fp32_param")

    def set_local_grad(self, param, value):
        self._set_piece(param, self._targets("grad"), _unscaled(value, self.post_reduce_factor), True,
                        "safe_set_local_grad")

    def set_local_optimizer_state(self, param, value, key):
        self._set_piece(param, self._targets("state", key), value, True, "safe_set_local_optimizer_state")

    # ---- memory -------------------------------------------------------------------------------------------
    def memory_tensors(self):
        """{category: [tensors]} of everything this owner holds (memory_breakdown counts them)."""
        cats = {"params": list(self.store.flats), "masters": [] if self.store.masters_are_params
                else list(self.store.masters), "optimizer_states": [], "grads": [], "comm_buffers": []}
        cats["comm_buffers"] += [u.host16 for u in self.store.units if u.host16 is not None]
        cats["comm_buffers"] += [u.host_grad for u in self.store.units if u.host_grad is not None]
        if self.swap is not None:   # the window of states on the host (the rest are in files: swap.nvme_bytes)
            cats["swap_window"] = self.swap.host_buffers()
        if self.param_swap is not None:   # the window of stage 3's shards (the rest are in their files)
            cats["param_swap_window"] = self.param_swap.host_buffers()
        if self._optimizer is not None:
            for shard in self.store.shards:
                cats["optimizer_states"] += [t for t in self._optimizer.state.get(shard, {}).values()
                                             if torch.is_tensor(t) and t.numel() > 1]
        return cats


class ShardedOptimizerState(ShardedBase):
    stage = 1

    def __init__(self, store, precision, group=None, allocate=None):
        super().__init__(store, precision, group)
        layout = [([store.params[e.param] for e in plan.entries], plan.padded) for plan in store.plans]
        # param.grad are views of the buckets when gradients are reduced in the parameters' dtype; else each
        # gradient is added into its slice of reduce-dtype buckets as it arrives (communication_data_type fp32)
        views = precision.reduce_dtype == precision.param_dtype
        self.buffers = GradBuffers(store.params, layout, grads_are_views=views, accum_dtype=precision.reduce_dtype,
                                   allocate=allocate)
        chunks = [plan.shard_range(self.rank) for plan in store.plans]
        for u, b in zip(store.units, self.buffers.buckets):   # a unit's gradient: its slice of the full bucket
            u.grad = b.flat[slice(*u.plan.shard_range(self.rank))]
            if store.placement.copies_states:
                u.host_grad = store.placement.host_empty(u.grad.numel(), u.grad.dtype)
        # as each bucket's reduction lands, while the rest of backward runs (as at stages 2-3): its slice's copy to
        # the host (offload, distinct host) and its norms
        self.intake = build_grad_sync(self.buffers, self.world, self.rank, group, allocate, chunks, self._landed)
        self.reducer = self.intake.reducer
        self._copied_at = None   # buffers.version() when the host copies were last made whole (None: not since)

    def end_backward(self):
        if self.intake.end_backward():   # every bucket was reduced, so copied
            self._copied_at = self.buffers.version()
        if self.store.swap is not None and self.world == 1 and self._boundary:
            # one rank reduces nothing (no callback ran): the states are read ahead now, the last layers' first
            # (a no-op for units read already, or without a free buffer)
            for u in sorted(self.store.units, key=lambda u: -min(e.param for e in u.plan.entries)):
                self.store.swap.read_ahead(u)

    def host_grads_current(self):
        return self._copied_at is not None and self._copied_at == self.buffers.version()

    def zero_grads(self):
        self._before_zeroing_grads()
        self.buffers.zero()
        self.intake.reset()
        self._copied_at = None

    def clear_grads(self):
        self.zero_grads()   # param.grad are views of the zeroed buckets again

    def memory_tensors(self):
        cats = super().memory_tensors()
        cats["grads"] += self.buffers.flats()
        return cats


class ShardedGradients(ShardedBase):
    stage = 2
    reduces_every_micro_step = True   # the engine refuses no_sync() for it

    def __init__(self, store, precision, group=None, allocate=None):
        """allocate: a shm_reduce.SharedTable for same-host ranks (the reduction then goes through /dev/shm)."""
        super().__init__(store, precision, group)
        dev, dt = store.device, precision.reduce_dtype   # the gradient shards accumulate in the reduce dtype
        for u in store.units:
            u.grad = torch.zeros(u.plan.shard, dtype=dt, device=dev)
            # offload, distinct host: each shard is copied to (pinned) host memory as soon as its last
            # reduce-scatter of the accumulation window lands, while the rest of backward runs
            if store.placement.copies_states:
                u.host_grad = store.placement.host_empty(u.plan.shard, dt)
        buckets = [grad_buckets.ContiguousBucket(u.plan, u.grad) for u in store.units]
        self.reducer = reducer_for(buckets, self.world, self.rank, group, allocate)
        # stage 2 reduces at every micro-step, boundary or not: the partition accumulates (as DeepSpeed's)
        entries = [store.bucket_of[id(p)][1] for p in store.params]   # (entry.param: the position in params)
        self.intake = GradIntake(store.params, self.reducer, self.world, entries=entries, stage=self.stage,
                                 landed=self._landed)

    def zero_grads(self):
        self._before_zeroing_grads()
        for u in self.store.units:
            u.grad.zero_()

    def memory_tensors(self):
        cats = super().memory_tensors()
        cats["grads"] += self.grad_shards()
        cats["comm_buffers"] += self.reducer.in_flight_buffers() + self.reducer.memory()
        return cats


def build_sharded_owner(stage, params, group_of, policy, bucket_elems, world, rank, placement,
                        group=None, module=None, shared=None):
    """Flatten `params` into partitioned buckets and return the stage's owner. For fp16/bf16 the module is cast
    after the fp32 values were captured for the masters. `shared()`, when given, makes a shm_reduce.SharedTable
    allocator (same-host CPU ranks): parameter buckets (both stages) and stage 1's gradient buckets then live in
    shared memory and are gathered / reduced there."""
    dtype = policy.param_dtype
    if dtype != torch.float32:
        fp32 = [p.detach().float() for p in params]
        if module is not None:
            module.to(dtype)
        for p, v in zip(params, fp32):   # FlatShards reads fp32 values for the masters, then casts
            p.data = v
    if stage not in (1, 2):
        raise NotImplementedError(f"ZeRO stage {stage} is not implemented by the sharded owners (stages 1, 2)")
    store = FlatShards(params, group_of, dtype, bucket_elems, world, rank, placement,
                       allocate=shared() if shared else None, master_dtype=policy.master_dtype, group=group)
    if stage == 1:
        return ShardedOptimizerState(store, policy, group, allocate=shared() if shared else None)
    return ShardedGradients(store, policy, group, allocate=shared() if shared else None)
