"""ZeRO stage 3's parameter partitioning: one rank's slice of each parameter, gathered whole only while used.

Every partitioned parameter carries a PartitionedParam (`param._dsfast_z3`). The rank keeps `shard`, its slice of
the flattened parameter padded to `world * ALIGN` elements (the same layout as a one-parameter partition.BucketPlan,
so the stage 1/2 maths, checkpoint records and formulas apply unchanged). `full` is the padded whole parameter. Two
ways to
release it:
  after a module's forward  its storage is resized to 0 bytes and back when the parameter is gathered for
                            backward. Keeping that one storage object matters: tensors autograd saved during
                            forward (weight.t() views, checkpointing's detached copies) point at it and see the
                            values again once the parameter is re-gathered; dropping it instead would keep every
                            saved weight alive until backward (the whole model).
  anywhere else             the storage is handed over to whoever still references it (a state_dict taken inside
                            GatheredParameters, autograd's last saved tensors) and freed when they drop it; the
                            next gather allocates a new one. Safe for any reference a user kept.

Gathering: ranks on one host (fp32, CPU) copy the parameter out of a shared-memory snapshot of every rank's shard
(shared.py, no collective); otherwise an all-gather through the records' transport (`comm`, one per process group:
transport/transports.py), one for all the records one gather() call fills.

While released, `param.data` is an empty tensor of the parameter's dtype, so nothing can read stale memory; while
gathered it is a view of `full` with the parameter's shape.

Where the whole values are is one state (ShardedState, FSDP2's name), changed only through `_move`, which refuses a
transition that is not in MOVES (naming the parameter): SHARDED -> UNSHARDED (gather), SHARDED -> GATHERING (a
prefetch launched) -> GATHERED (it landed) -> UNSHARDED (used) or SHARDED (never used), UNSHARDED -> SHARDED
(released) or UNSHARDED (refreshed after a step). Who holds a parameter UNSHARDED: `refs` (forward passes and
GatheredParameters blocks in progress), `backward_hold` (its module's backward has started and its gradient has not
been reduced yet) and `persistent` (small parameters, param_persistence_threshold, are never released). `release()`
frees it when none of them does.
"""
import contextlib
import enum
import itertools

import torch

from ...accelerator.streams import LaneError
from ...comm.where import at_work, done
from .gather_order import note_launch
from ..policy.partition import ALIGN, BucketPlan, Entry, round_up
from ..transport.transports import gather_comm


class ZeroParamStatus(enum.Enum):
    """DeepSpeed's `param.ds_status` values (deepspeed.runtime.zero.partition_parameters.ZeroParamStatus)."""
    AVAILABLE = 1        # whole on this rank
    NOT_AVAILABLE = 2    # only this rank's slice is here
    INFLIGHT = 3         # being gathered (prefetched)


class ZeroParamType(enum.Enum):
    """DeepSpeed's parameter kinds (deepspeed.zero.ZeroParamType)."""
    NORMAL = 1           # a plain torch parameter
    PARTITIONED = 2      # split across the data-parallel ranks (ZeRO stage 3)
    REMOTE = 3           # held by one rank only (DeepSpeed's name; no dsfast parameter is)


class ShardedState(enum.Enum):
    SHARDED = "sharded"        # only this rank's slice; param.data is empty
    GATHERING = "gathering"    # an all-gather is filling `full` (prefetch.Flight)
    GATHERED = "gathered"      # `full` holds the whole values, not published as param.data yet (prefetched)
    UNSHARDED = "unsharded"    # param.data is a view of `full`


SHARDED, GATHERING, GATHERED, UNSHARDED = ShardedState
MOVES = {SHARDED: {UNSHARDED, GATHERING}, GATHERING: {GATHERED}, GATHERED: {UNSHARDED, SHARDED},
         UNSHARDED: {UNSHARDED, SHARDED}}
DS_STATUS = {SHARDED: ZeroParamStatus.NOT_AVAILABLE, GATHERING: ZeroParamStatus.INFLIGHT,
             GATHERED: ZeroParamStatus.INFLIGHT, UNSHARDED: ZeroParamStatus.AVAILABLE}


_ids = itertools.count()
# what a partitioned parameter carries (stage3.detach() takes them off again)
DS_PARAM_ATTRS = ("_dsfast_z3", "ds_id", "ds_shape", "ds_numel", "ds_status", "ds_tensor", "ds_persist",
                  "all_gather_coalesced", "all_gather", "partition")   # (param_methods.py)


def whole_numel(param):
    """Elements of the whole parameter, also while a stage 3 parameter holds only its slice."""
    return getattr(param, "ds_numel", None) or param.numel()


class _Mirrored:
    """A PartitionedParam field that also sets an attribute of the parameter: what programs written for
    DeepSpeed read off a stage 3 parameter (`hasattr(p, "ds_id")` is how they tell a partitioned one, e.g. to
    gather it before saving) follows the state as it changes."""

    def __init__(self, ds_name, value_of=None):
        self.ds_name, self.value_of = ds_name, value_of

    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, rec, owner=None):
        return self if rec is None else getattr(rec, self.slot)

    def __set__(self, rec, value):
        setattr(rec, self.slot, value)
        setattr(rec.param, self.ds_name, value if self.value_of is None else self.value_of(rec))


class PartitionedParam:
    state = _Mirrored("ds_status", lambda rec: DS_STATUS[rec.state])   # set through _move only
    shard = _Mirrored("ds_tensor")
    persistent = _Mirrored("ds_persist")

    def __init__(self, param, world, rank, group=None, device=None, shard_device=None, dtype=None, pin=False):
        """Partition `param` (whole and equal on every rank) in place: keep this rank's slice, free the rest."""
        self.param = param
        self.shape = tuple(param.shape)
        self.numel = param.numel()
        self.dtype = dtype or param.dtype
        self.world, self.rank = world, rank
        self.join(group)
        self.device = torch.device(device) if device is not None else param.device
        self.shard_device = torch.device(shard_device) if shard_device is not None else self.device
        self.pin = bool(pin and self.shard_device.type == "cpu" and torch.cuda.is_available())
        self.padded = round_up(max(self.numel, 1), world * ALIGN)
        self.shard_numel = self.padded // world
        self.refs = 0
        self.backward_hold = False
        self.persistent = False
        self.state = SHARDED
        self.shard = torch.zeros(self.shard_numel, dtype=self.dtype, device=self.shard_device, pin_memory=self.pin)
        with torch.no_grad():
            a, b = self.owned_range()
            self.shard[:b - a].copy_(param.detach().reshape(-1)[a:b])
        self.full = None
        self.shared, self.shared_offset = None, 0   # shared_params.SharedParams: same-host ranks' snapshot
        self.flight = None                           # prefetch.Flight filling `full` (GATHERING)
        self.swap = None                             # nvme_params.NvmeParams when the shard lives in a swap file
        self.position = None                         # its index among its model's parameters (stage 3 owner)
        self.name = None                             # and its name there (for errors)
        self.unit = None                             # the shard unit stepping this shard (trained, stage 3 owner)
        param.data = self._empty()
        param._dsfast_z3 = self
        param.ds_id, param.ds_shape, param.ds_numel = next(_ids), torch.Size(self.shape), self.numel

    # ---- state -----------------------------------------------------------------------------------------------
    @property
    def gathered(self):
        """param.data is the whole parameter."""
        return self.state is UNSHARDED

    @property
    def ready(self):
        """Prefetched: the whole values are in `full`, to be published by the next gather()."""
        return self.state is GATHERED

    def _move(self, to):
        if to not in MOVES[self.state]:
            raise RuntimeError(f"ZeRO stage 3 parameter ds_id={self.param.ds_id} of shape {self.shape}: "
                               f"{self.state.value} -> {to.value} is not a valid transition (valid from "
                               f"{self.state.value}: {', '.join(sorted(m.value for m in MOVES[self.state]))})")
        self.state = to

    def join(self, group):
        """Gather over `group` (of this record's world and rank) from now on."""
        self.group = group
        self.comm = gather_comm(self.world, self.rank, group)

    # ---- layout ----------------------------------------------------------------------------------------------
    def shard_range(self):
        return self.rank * self.shard_numel, (self.rank + 1) * self.shard_numel

    def owned_range(self):
        """[a, b): the elements of the flattened parameter in this rank's slice (the rest of it is padding)."""
        lo, hi = self.shard_range()
        return min(lo, self.numel), min(hi, self.numel)

    def plan(self, index, group_index, param_index):
        """This parameter as a one-parameter bucket (what the stage 1/2 step, records and formulas read)."""
        return BucketPlan(index, group_index, (Entry(param_index, 0, self.numel),), self.numel, self.padded,
                          self.world)

    def _empty(self):
        return torch.empty(0, dtype=self.dtype, device=self.device)

    def cast(self, dtype):
        """Change the model dtype (fp16/bf16 training): the shard is rounded, the full buffer re-made."""
        if dtype == self.dtype:
            return
        was = self.gathered
        if was:
            self.free()
        self.dtype = dtype
        self.shard = self.shard.to(dtype)
        if self.pin:
            self.shard = self.shard.pin_memory()
        self.full = None
        self.param.data = self._empty()
        if was:
            gather([self])

    # ---- gather / free ---------------------------------------------------------------------------------------
    def _alloc_full(self):
        if self.full is None:
            self.full = torch.empty(self.padded, dtype=self.dtype, device=self.device)
        elif self.full.untyped_storage().nbytes() == 0:
            self.full.untyped_storage().resize_(self.padded * self.full.element_size())

    def _src(self):
        """This rank's shard as a gather sends it (after _await_step)."""
        src = self.shard if self.swap is None else self.swap.copy_of(self)
        return src if src.device == self.device else src.to(self.device, non_blocking=True)

    def _await_step(self):
        """The step has written this shard before a gather reads it: the unit's upload of new 16-bit values landed
        (lanes), and with overlap_step its update in the worker (step/overlap.py) is done."""
        if self.unit is not None:
            try:
                self.unit.step_event.wait()
            except LaneError:   # (a gather is a collective: the step or the next settle raises it, on every rank)
                pass

    def _launch(self):
        """Start filling `full` from every rank's shard; returns a handle (None when done already)."""
        self._await_step()
        self._alloc_full()
        if self.shared is not None:   # same-host ranks: a copy out of the last published snapshot
            self.shared.fill(self, self.full)
            return None
        if self.world == 1:
            self.full.copy_(self._src())
            return None
        note_launch([self])
        return self.comm.all_gather_async(self.full, self._src(), ("gather", (self,)))

    def _publish(self):
        self.param.data = self.full[:self.numel].view(self.shape)
        self._move(UNSHARDED)

    def free(self, resize=False):
        """resize=True: shrink the storage in place (after forward, see above); else let it go."""
        self._move(SHARDED)
        self.param.data = self._empty()
        if resize:
            self.full.untyped_storage().resize_(0)
        else:
            self.full = None

    def prefetched(self, flight):
        """prefetch.py: `flight` started filling `full` (None: it landed)."""
        self._move(GATHERING if flight is not None else GATHERED)
        self.flight = flight

    def drop_prefetch(self):
        """Prefetched and never used: give the memory back (the storage object stays: tensors autograd saved may
        point at it, see above)."""
        self._move(SHARDED)
        self.full.untyped_storage().resize_(0)

    def release(self, resize=False):
        """Free the whole parameter unless something still holds it."""
        if self.gathered and not self.persistent and self.refs <= 0 and not self.backward_hold:
            self.free(resize)

    @torch.no_grad()
    def set_from_full(self, full_values):
        """This rank's slice of new whole values (GatheredParameters' modifier rank broadcast them)."""
        a, b = self.owned_range()
        self.set_slice(full_values.reshape(-1)[a:b])

    @torch.no_grad()
    def set_slice(self, values):
        """New values for the elements this rank keeps (owned_range's; the padding stays zero); the owner's master
        follows the shard."""
        with self.holding(read=False):
            self.shard.zero_()
            self.shard[:values.numel()].copy_(values.reshape(-1))
            owner = getattr(self.param, "_dsfast_owner", None)   # (a frozen parameter has none)
            if owner is not None:
                owner.shard_changed(self.param)

    def holding(self, read=True, write=True):
        """A block in which `shard` is in memory: with offload_param on NVMe, read from its file (read=False: the
        block overwrites it all) and written back after (write=False: not); otherwise nothing to do."""
        if self.swap is None:
            return contextlib.nullcontext(self.shard)
        return self.swap.holding(self.shard, read=read, write=write)


def record_of(param):
    return getattr(param, "_dsfast_z3", None)


@torch.no_grad()
def gather(records, refresh=False):
    """All-gather every record that is not whole yet (all at once, then wait). refresh=True re-gathers those
    already whole too (their shards changed: after an optimizer step). A collective: every rank calls it with the
    same records in the same order. Records gathered by a collective go in one all-gather per (dtype, device,
    group): their shards back to back."""
    todo = [r for r in records if refresh or not r.gathered]
    pending, alone, flights = {}, [], []
    for r in todo:
        if r.flight is not None:   # prefetched (prefetch.py)
            if r.flight not in flights:
                flights.append(r.flight)
        elif r.ready:
            pass
        elif r.shared is not None or r.world == 1:
            r._launch()
        else:
            pending.setdefault((r.dtype, r.device, id(r.group), r.world), []).append(r)
    if not (pending or flights):
        for r in todo:
            r._publish()
        return
    at_work(("gather", todo))   # the hang watch's tag (where.py): only where a collective runs
    launched = []
    for recs in pending.values():
        if len(recs) == 1:   # (_launch's collective branch, without its call: this path is hot)
            r = recs[0]
            r._await_step()
            r._alloc_full()
            note_launch(recs)
            alone.append(r.comm.all_gather_async(r.full, r._src(), ("gather", (r,))))
        else:
            launched.append(launch_coalesced(recs))
    for h in alone:
        h.wait()
    for recs, handle, out, total in launched:
        handle.wait()
        unpack_coalesced(recs, out, total)
    for f in flights:
        f.finish()
    for r in todo:
        r._publish()
    done()


def launch_coalesced(recs):
    for r in recs:
        r._await_step()
    total = sum(r.shard_numel for r in recs)
    src = torch.cat([r._src() for r in recs])
    out = torch.empty(recs[0].world * total, dtype=recs[0].dtype, device=recs[0].device)
    for r in recs:
        r._alloc_full()
    note_launch(recs)
    return recs, recs[0].comm.all_gather_async(out, src, ("gather", recs)), out, total


def unpack_coalesced(recs, out, total):
    """out is rank-major (chunk q: rank q's shards back to back): each record's slices into its `full`, one
    strided copy a record."""
    rows = out.view(recs[0].world, total)
    off = 0
    for r in recs:
        s = r.shard_numel
        r.full.view(r.world, s).copy_(rows[:, off:off + s])
        off += s


def publish(records):
    """After shards changed outside a step (GatheredParameters' modifier): same-host ranks refresh the shared
    snapshot. A collective for every rank with the same records; nothing to do when none is shared."""
    tables = {}
    for r in records:
        if r.shared is not None:
            tables.setdefault(id(r.shared), (r.shared, []))[1].append(r)
    for table, recs in tables.values():
        table.publish(recs)
