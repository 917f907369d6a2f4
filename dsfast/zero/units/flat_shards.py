"""The partitioned storage of ZeRO stages 1 and 2: flat parameter buckets and each rank's master shards (fp32, or
16-bit ones in the model's dtype, kept as an fp32 model's are).

Model parameters become views into flat buckets (one per partition.BucketPlan, in the model's dtype, padded), so
that the post-step all-gather writes every parameter at once and a rank's shard is a plain slice. Each rank keeps,
per bucket, an fp32 master of its slice, wrapped as a torch.nn.Parameter: the optimizer is built over these shard
parameters (one per bucket, in the bucket's param group), so `optimizer.state[shard]` holds flat moments and any
torch optimizer works. For an fp32 model whose masters stay on the parameters' device the shard IS the slice of
the parameter bucket: no second fp32 copy exists (DeepSpeed keeps one).

Placement (placement.py): with offload_optimizer the masters and states live on the host (pinned when asked and a
GPU is present), and where the host is distinct from the device the CPU optimizer writes the updated 16-bit
values into host copies (host16) that go to the device after the step.
"""
import torch

from ..nvme.states import nvme_states
from ..policy.partition import plan_buckets
from ..transport.transports import comm_for
from .shard_unit import ShardUnit, UnitStore


class FlatShards(UnitStore):
    def __init__(self, params, group_of, model_dtype, bucket_elems, world, rank, placement, allocate=None,
                 master_dtype=torch.float32, group=None):
        """params: trainable parameters in model order (still fp32 when model_dtype is 16-bit: the masters are
        taken from them before the cast); group_of: param-group index per param. `allocate(numel, dtype, device)`
        (shm_reduce.SharedTable), when given, provides one storage for every parameter bucket: same-host ranks then
        all-gather through shared memory (`table` is set when it did). placement: placement.Placement.
        master_dtype: fp32, or model_dtype (16-bit masters: kept as an fp32 model's masters are). group: the
        process group of the `world` ranks (the updated shards' all-gathers go over it by default)."""
        self.params = list(params)
        self.world, self.rank = world, rank
        self.model_dtype = model_dtype
        self.master_dtype = master_dtype
        self.mixed = model_dtype != master_dtype   # the optimizer writes 16-bit copies of fp32 masters
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.placement = placement
        self.offload = placement.offload_states
        self.master_device = placement.states_device
        self.pin = placement.pin
        self.masters_are_params = placement.masters_alias(self.mixed)
        total = sum(p.numel() for p in self.params)
        # a bucket is never larger than the model (DeepSpeed allocates its 500M-element default regardless)
        bucket_elems = max(1, min(int(bucket_elems), total))
        kinds = [(str(p.device),) for p in self.params]
        self.plans = plan_buckets([p.numel() for p in self.params], group_of, kinds, bucket_elems, world)
        self.flats = []   # the parameter buckets (model dtype, padded): what the all-gather fills
        self.units = []   # one shard_unit.ShardUnit per bucket: this rank's slice of everything the bucket keeps
        self.table = None
        storage = allocate(sum(p.padded for p in self.plans), model_dtype, self.device) if allocate else None
        if storage is not None and getattr(allocate, "table", None) is not None:
            self.table = allocate.table        # [world, numel]: row r is rank r's parameter buckets
        offset = 0
        # offload_optimizer on NVMe: each master (and, once they exist, its optimizer states) goes to its swap
        # file as soon as it is made
        self.swap = nvme_states([p.shard for p in self.plans], placement, rank)
        with torch.no_grad():
            for plan in self.plans:
                flat = storage[offset:offset + plan.padded] if self.table is not None else \
                    torch.zeros(plan.padded, dtype=model_dtype, device=self.device)
                offset += plan.padded
                lo, hi = plan.shard_range(rank)
                master = None
                if self.mixed:  # fp32 masters from the fp32 values, before they are rounded to 16 bits
                    master = torch.zeros(plan.shard, dtype=torch.float32, device=self.master_device,
                                         pin_memory=self.pin)
                for e in plan.entries:
                    p = self.params[e.param]
                    flat[e.offset:e.offset + e.numel].copy_(p.detach().reshape(-1))
                    if master is not None:
                        a, b = max(lo, e.offset), min(hi, e.offset + e.numel)
                        if a < b:
                            master[a - lo:b - lo].copy_(p.detach().reshape(-1)[a - e.offset:b - e.offset])
                for e in plan.entries:
                    p = self.params[e.param]
                    p.data = flat[e.offset:e.offset + e.numel].view(p.shape)
                if master is None:
                    master = flat[lo:hi] if self.masters_are_params else \
                        flat[lo:hi].to(self.master_device, copy=True)   # (16-bit masters: of the rounded values)
                    if self.pin:
                        master = master.pin_memory()
                self.flats.append(flat)
                shard = torch.nn.Parameter(master, requires_grad=True)
                shard._dsfast_bucket = plan.index
                # offload to a distinct host: the CPU optimizer writes the 16-bit values into a host copy
                host16 = placement.host_copy(flat[lo:hi]) if self.mixed and placement.copies_states else None
                self.units.append(ShardUnit(plan, flat[lo:hi], master, shard, host16))
                if self.swap is not None:
                    self.swap.adopt(self.units[-1])
        if self.swap is not None:
            self.swap.adopted()
        # the updated shards' all-gathers: through the shared table where the buckets live in one, else c10d
        self.comm = comm_for([], world, rank, group, table=self.table)
        self.bucket_of = {}   # id(param) -> (plan, entry)
        for plan in self.plans:
            for e in plan.entries:
                self.bucket_of[id(self.params[e.param])] = (plan, e)

    @torch.no_grad()
    def all_gather(self, group=None, buckets=None):
        """Every rank's updated slice into every rank's parameter buckets (in place: the input is our own slice).
        buckets: the indices of those to gather (default all; one at a time for a worker thread that gathers each
        unit as its step ends). group: another process group over the same ranks (default the store's)."""
        if self.world == 1:
            return
        pairs = []
        for i in range(len(self.flats)) if buckets is None else buckets:
            lo, hi = self.plans[i].shard_range(self.rank)
            pairs.append((self.flats[i], self.flats[i][lo:hi]))
        self.comm.all_gather(pairs, ("updated shards",), group)
