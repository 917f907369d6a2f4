"""ZeRO stage 3's state owner: parameters, gradients and optimizer states all partitioned; no rank holds the model.

Every parameter is partitioned on its own (partitioned_param.py: a one-parameter bucket, padded to world x 16),
so zero.Init can partition a module as it is built in exactly the layout training uses. The module hooks
(param_hooks.py) gather parameters around each module's forward and backward; this owner
  - takes each parameter's gradient as soon as autograd has accumulated it (a post-accumulate-grad hook) into its
    gradient bucket (grad_buckets.py), releases the whole parameter, and reduce-scatters each complete bucket into
    this rank's gradient shards (accumulated across micro-steps, as stage 2 does);
  - steps the shards with stage 1/2's step (shard_step.step_shards over Stage3Store, which has FlatShards' shape):
    the updated shard stays partitioned, only persistent (small) parameters are gathered again.
Placement: offload_optimizer puts masters and optimizer states on the host; offload_param puts the model-dtype
shards on the host (copied to the device for each gather). fp32 with both on one device keeps one copy only.
"""
import torch

import torch.distributed as dist

from ...comm.where import waiting
from ..transport.shm import shm_allocator
from ..grads import buckets as grad_buckets
from ..grads.intake import GradIntake
from ..params.hooks import ParamCoordinator
from ..nvme.params import nvme_params
from ..nvme.states import nvme_states
from ..grads.reducer import reducer_for
from ..params.gather_order import check_same_gathers
from ..params.leaf_granularity import set_leaves_by_granularity
from ..params.ds_methods import attach as attach_ds_methods
from ..params.partitioned_param import DS_PARAM_ATTRS, PartitionedParam, gather, record_of
from ..units.shard_unit import ShardUnit, UnitStore, copy_on_lane
from ..params.shared import SharedParams, shareable
from .sharded import ShardedBase
from ..owner import SliceRecord

# gradient bucket cap (elements; a smaller zero_optimization.reduce_bucket_size wins): big enough that a small
# model's backward is a handful of reductions, small enough to bound the staging buffers of a large one
STAGE3_BUCKET_ELEMS = 1 << 22


class Stage3Store(UnitStore):
    """The trained parameters' shards, in the shape stage 1/2's step and records read (one plan per param)."""

    def __init__(self, params, group_of, records, all_records, model_dtype, placement, masters_fp32,
                 master_dtype=torch.float32):
        self.params = list(params)
        self.records = list(records)
        self.all_records = list(all_records)
        self.model_dtype = model_dtype
        self.master_dtype = master_dtype   # fp32, or model_dtype (16-bit masters: handled as an fp32 model's)
        self.mixed = model_dtype != master_dtype   # the optimizer writes 16-bit copies of fp32 masters
        self.placement = placement
        self.device = placement.device
        self.world = records[0].world if records else 1
        self.rank = records[0].rank if records else 0
        self.offload = placement.offload_states
        self.master_device = placement.states_device
        self.slices_on_device = not placement.offload_params
        self.masters_are_params = placement.masters_alias(self.mixed, params_offloaded=placement.offload_params)
        self.plans = [r.plan(i, g, i) for i, (r, g) in enumerate(zip(self.records, group_of))]
        self.units = []   # one shard_unit.ShardUnit per trained parameter (a one-parameter bucket)
        self.bucket_host = None   # offload to a distinct host: one host buffer per gradient bucket (stage3 build)
        # offload_optimizer on NVMe: each master goes to its swap file as soon as it is made
        self.swap = nvme_states([r.shard_numel for r in self.records], placement, self.rank)
        for i, (r, plan) in enumerate(zip(self.records, self.plans)):
            m32, masters_fp32[i] = masters_fp32[i], None   # (held no longer than its unit needs it)
            if m32 is None:   # a shard zero.Init put on NVMe: its fp32 values, then its file in the model dtype
                m32 = r.swap.copy_of(r, trace=False).float()
                if r.dtype != model_dtype:
                    r.swap.recast(r, m32.to(model_dtype))
            if self.masters_are_params:
                master = r.shard
            elif m32 is not r.shard and m32.device == self.master_device and m32.dtype == master_dtype:
                master = m32   # the fp32 values the 16-bit cast left behind: nobody else holds them, no copy
            else:
                master = m32.to(self.master_device, dtype=master_dtype, copy=True)
            if placement.pin and not master.is_pinned():
                master = master.pin_memory()
            shard = torch.nn.Parameter(master, requires_grad=True)
            shard._dsfast_bucket = plan.index
            # the CPU optimizer writes 16-bit values into host copies when the shards stay on the device
            host16 = placement.host_copy(r.shard) \
                if self.mixed and placement.copies_states and not placement.offload_params else None
            # (the gradient: a view of its bucket's flat shard, set by build_stage3_owner once buckets exist)
            self.units.append(ShardUnit(plan, r.shard, master, shard, host16))
            r.unit = self.units[-1]   # (a gather of the shard waits for the unit's upload: partitioned_param.py)
            if self.swap is not None:
                self.swap.adopt(self.units[-1])
        if self.swap is not None:
            self.swap.adopted()
        self.param_swap = None   # offload_param on NVMe: nvme_params.NvmeParams (stage3 build, once persistent
        #                          parameters are known)
        self.bucket_of = {id(p): (plan, plan.entries[0]) for p, plan in zip(self.params, self.plans)}
        self.shared = None   # shared_params.SharedParams when same-host ranks gather through /dev/shm

    @property
    def flats(self):
        """The model-dtype storage this rank keeps: its shard of every parameter (trained or not)."""
        return [r.shard for r in self.all_records]

    def all_gather(self, group=None):
        """After a step: parameters whole right now (persistent ones, open GatheredParameters) get new values."""
        if self.shared is not None:
            self.shared.publish()
        gather([r for r in self.all_records if r.gathered], refresh=True)


class Stage3(ShardedBase):
    stage = 3
    partitions_params = True
    reduces_every_micro_step = True   # the engine refuses no_sync()

    def __init__(self, store, precision, coordinator, group, reducer):
        """reducer: the reduction over store.records' gradient buckets (reducer.reducer_for)."""
        super().__init__(store, precision, group)
        self.coordinator = coordinator
        self.reducer = reducer
        self._index = {id(p): i for i, p in enumerate(store.params)}
        # stage 3 reduces at every micro-step; the host copies are made in the boundary's backward only
        self.intake = GradIntake(store.params, reducer, self.world, entries=store.records, stage=self.stage,
                                 landed=self._bucket_landed,
                                 taken=self._release)

    @property
    def gathers_through(self):
        """How parameters are gathered: "shm" (same-host ranks copy from a /dev/shm snapshot) or "collectives"."""
        return "shm" if self.store.shared is not None else "collectives"

    def _shape_of(self, param):
        return record_of(param).shape   # the parameter itself is empty while released

    def begin_backward(self, reduce):
        self.coordinator.begin_backward()
        self.intake.begin_backward(reduce)

    def _release(self, i):
        """Param i's gradient was taken: the whole parameter is no longer needed by this backward."""
        rec = self.store.records[i]
        rec.backward_hold = False
        rec.release()

    @torch.no_grad()
    def end_backward(self):
        self.coordinator.end_backward()
        self.intake.end_backward()
        for r in self.store.all_records:   # frozen parameters, ones whose gradient never came
            r.backward_hold = False
            r.release()
        if self.store.world > 1 and self.store.shared is None:   # (gathers by collectives)
            check_same_gathers(self.group, self.store.device)

    @torch.no_grad()
    def shard_changed(self, param):
        """GatheredParameters(modifier_rank=...) wrote new values into the shard: the master follows."""
        i = self._index.get(id(param))   # (a shard on NVMe is held in memory by the caller: set_slice)
        if i is not None and not self.store.masters_are_params:
            unit = self.store.units[i]
            with self.visiting(writes=True) as use:   # (on NVMe: the master is read in, then written back)
                use(unit.shard)
                unit.master.copy_(unit.slice16)

    def _bucket_landed(self, bucket):
        """A bucket's reduced gradient shards are final: to the host (offload, distinct host) on the d2h lane, one
        copy for the bucket, its event every member unit's grad_event; their norms (landed_norms.py); and their
        states read ahead (NVMe)."""
        units = [self.store.units[i] for i, _ in bucket.members]
        if self.store.bucket_host is not None:
            event = copy_on_lane(self.store.lanes.device_lane("d2h"), self.store.bucket_host[bucket.index],
                                 bucket.grad_flat, f"gradient bucket {bucket.index} to the host")
            for u in units:
                u.grad_event = event
        for u in units:
            self.landed_norms.landed(u)
            if self.store.swap is not None:   # its states' read from NVMe starts while backward goes on
                self.store.swap.read_ahead(u)

    def module_slices(self, names, exclude_frozen=False, values=True):
        """SliceRecords of this rank's slice of every partitioned parameter's model-dtype values (trained or
        frozen: what the checkpoint's module weights hold, written by every rank for its own slice instead of
        gathered on one); names: id(param) -> qualified name. A rank holding only padding of a parameter adds
        nothing for it. values=False: only the names and ranges are wanted (a shard on NVMe is not read)."""
        out = []
        for r in self.store.all_records:
            if exclude_frozen and not r.param.requires_grad:
                continue
            a, b = r.owned_range()
            if a < b:   # (a shard on NVMe: a copy read from its file)
                shard = r.shard if r.swap is None or not values else r.swap.copy_of(r, trace=False)
                out.append(SliceRecord(names[id(r.param)], r.shape, a, b, shard, 0))
        return out

    def empty_partition_cache(self):
        for r in self.store.all_records:
            r.release()

    def zero_grads(self):
        self._before_zeroing_grads()
        for g in self.store.grads:
            g.zero_()

    @torch.no_grad()
    def detach(self):
        """Hooks off and every parameter whole again (a collective), so the module is an ordinary one."""
        if self.overlap is not None:
            self.overlap.detach()
        self.settle(agree=True)   # (every rank raises a failed overlapped step alike, before the gather below)
        self.intake.detach()
        self.coordinator.detach()
        recs = self.store.all_records
        gather(recs)
        for r in recs:
            r.param.data = r.full[:r.numel].clone().view(r.shape)
            for name in DS_PARAM_ATTRS:
                delattr(r.param, name)
        self.store.all_records = []
        self.store.close_lanes()

    def memory_tensors(self):
        cats = super().memory_tensors()
        cats["grads"] = list(self.store.grads)
        cats["gathered"] = [r.full for r in self.store.all_records if r.full is not None]
        cats["comm_buffers"] += self.reducer.in_flight_buffers()
        cats["comm_buffers"] += self.reducer.memory()
        if self.store.shared is not None:
            cats["comm_buffers"] += self.store.shared.memory()
        return cats


def _unique_params(model):
    seen, out = set(), []
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


@torch.no_grad()
def build_stage3_owner(model, params, group_of, policy, world, rank, placement, zero_cfg, group=None):
    """Partition every parameter of `model` not partitioned yet (zero.Init partitions them as they are built)
    and return the stage 3 owner. params: trainable parameters in model order; group_of: their group indices."""
    dtype = policy.param_dtype
    device = placement.device
    pin_param = bool(placement.offload_params and zero_cfg.offload_param.pin_memory)
    shard_device = placement.params_device
    records = []
    names = {id(p): n for n, p in model.named_parameters()}
    for p in _unique_params(model):
        rec = record_of(p)
        if rec is None:
            rec = PartitionedParam(p, world, rank, group, device, shard_device, pin=pin_param)
            attach_ds_methods(p)
        else:
            if rec.swap is not None and placement.nvme_params is None:
                _bring_back(rec)   # zero.Init put it on NVMe; this run keeps parameters in memory
            _adopt(rec, p, world, rank, group, device, shard_device, pin_param)
        rec.position, rec.name = len(records), names.get(id(p))   # (gather_order.py tells them apart by these)
        records.append(rec)
    trained = [record_of(p) for p in params]
    # before the 16-bit cast rounds them (shards zero.Init put on NVMe: read one by one by the store)
    masters_fp32 = [r.shard.float() if r.swap is None else None for r in trained]
    if dtype != torch.float32:
        model.to(dtype)   # buffers; the (released) parameters are recast by their records
        for r in records:
            if r.swap is None:
                r.cast(dtype)
    persistent = _persistent(records, int(zero_cfg.param_persistence_threshold),
                             int(zero_cfg.model_persistence_threshold))
    store = Stage3Store(params, group_of, trained, records, dtype, placement, masters_fp32, policy.master_dtype)
    for r in records:   # frozen parameters zero.Init put on NVMe: cast in their files
        if r.swap is not None and r.dtype != dtype:
            r.swap.recast(r, r.swap.copy_of(r, trace=False).to(dtype))
    persistent_set = {id(r) for r in persistent}
    store.param_swap = nvme_params(records, placement, rank, keep=[r for r in records if id(r) in persistent_set])
    if store.param_swap is not None:   # each unit knows whether its 16-bit slice lives in a file
        for u in store.units:
            u.param_swap = store.param_swap if store.param_swap.backs(u.slice16) else None
    allocate = _shm_allocator(records, device, world, group) if world > 1 else None
    if allocate is not None and store.param_swap is None:   # (a /dev/shm snapshot would hold every shard)
        shared = SharedParams(records, allocate)
        store.shared = shared if shared.ok else None
    bucket = max(1, min(int(zero_cfg.reduce_bucket_size), STAGE3_BUCKET_ELEMS))
    buckets = grad_buckets.plan(trained, bucket, world, policy.reduce_dtype, torch.device(device))
    for b in buckets:   # each unit's gradient is a view of its bucket's flat shard
        for i, rec in b.members:
            store.units[i].grad = b.grad_view(i, rec)
    if placement.copies_states:   # and its host copy, of the same layout
        store.bucket_host = [placement.host_empty(b.shard_numel, policy.reduce_dtype) for b in buckets]
        for b, host in zip(buckets, store.bucket_host):
            for i, rec in b.members:
                store.units[i].host_grad = host[b.offsets[i]:b.offsets[i] + rec.shard_numel]
    reducer = reducer_for(buckets, world, rank, group, allocate, shared=store.shared)
    if store.shared is not None:
        store.shared.publish()   # every rank's shards visible before the first gather
    for r in persistent:
        r.persistent = True
    gather(persistent)
    if int(zero_cfg.module_granularity_threshold) > 0:
        set_leaves_by_granularity(model, int(zero_cfg.module_granularity_threshold))
    prefetch = world > 1 and store.shared is None   # gathers by collectives: hide them behind compute
    coordinator = ParamCoordinator(model, prefetch=prefetch, prefetch_bucket=int(zero_cfg.prefetch_bucket_size),
                                   max_live=int(zero_cfg.max_live_parameters))
    return Stage3(store, policy, coordinator, group, reducer)


def _persistent(records, param_threshold, model_threshold):
    """The parameters kept whole: each at most param_threshold elements, in parameter order while their total
    stays within model_threshold (DeepSpeed's stage3_param / stage3_model_persistence_threshold)."""
    chosen, total = [], 0
    for r in records:
        if r.numel <= param_threshold and total + r.numel <= model_threshold:
            chosen.append(r)
            total += r.numel
    return chosen


def _shm_allocator(records, device, world, group):
    """A shm_reduce.SharedTable when stage 3 can go through shared memory (every rank agrees), else None."""
    ok = torch.tensor([1 if shareable(records, device) else 0])
    with waiting("shared tables"):
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=group)
        return shm_allocator(world, group) if ok.item() else None


def _bring_back(rec):
    swap = rec.swap
    swap.bring_back(rec)
    if not swap.records:
        swap.close()


def _adopt(rec, p, world, rank, group, device, shard_device, pin):
    """A parameter zero.Init partitioned: check it matches this run, move its shard where this config wants it."""
    if (rec.world, rec.rank) != (world, rank):
        raise RuntimeError(f"a parameter of shape {rec.shape} was partitioned by dsfast.zero.Init for rank "
                           f"{rec.rank} of {rec.world}, but initialize() runs as rank {rank} of {world}")
    rec.join(group)
    rec.device = torch.device(device)
    if rec.shard.device != shard_device:
        rec.shard = rec.shard.to(shard_device)
        rec.shard_device = shard_device
        rec.pin = bool(pin and shard_device.type == "cpu" and torch.cuda.is_available())
        if rec.pin:
            rec.shard = rec.shard.pin_memory()
    if rec.gathered:
        rec.free()
    rec.full = None
    p.data = rec._empty()
