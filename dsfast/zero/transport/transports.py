"""The transports: how ZeRO's buffers cross ranks, one object per process group and kind, as FSDP2's `Comm`.
For the one gradient reduction (grads/reducer.py): give a bucket its staging buffer (allocate), reduce it
(reduce-scatter or all-reduce, as its layout says: grads/buckets.py), and hand it back to the reducer
(`reduced(bucket)`) once its sum landed where the layout wants it (`bucket.land`). For the parameters: all-gather
every rank's shard into a whole flat buffer (`all_gather` for a list of buffers, waited for; `all_gather_async` for
one, on c10d a work handle): stages 1-2's updated shards (units/flat_shards.py), stage 3's parameters
(params/partitioned_param.py, through `gather_comm`). Both take another process group over the same ranks (a worker
thread's), default the transport's.

  LocalComm  "local"  one rank: staged gradients are added straight into the shards, nothing is sent
  C10dComm   "gloo"   an async c10d collective per bucket (at most MAX_IN_FLIGHT running), any backend
  ShmComm    "shm"    same-host CPU ranks: the buffers are columns of a /dev/shm table [world, n] (row q = what rank q
                      wrote). Reducing a bucket is a rendezvous, then rank r sums its chunk over every row.
                      Resident buckets live in the table for good (the gradient buffers were allocated there); staged
                      ones use two reused slots: a slot is reused two buckets later, by when every rank passed the
                      next bucket's rendezvous, so no one still reads it; a gradient that arrives before its slot is
                      free waits in a private buffer. The next backward writes slots again only after a rendezvous:
                      the step's publish (shared_params.py) or its own. An all-gather reads the other ranks'
                      chunks of a buffer out of their rows (the buffer is a column range of the table) after a
                      barrier: stages 1-2's parameter buckets live in such a table.

A bucket's layout decides the collective: staged buckets (stages 2-3) reduce-scatter their staging buffer, whose
chunk r is rank r's shard; resident ones (stages 0-1) are all-reduced (`chunk` None) or reduce-scattered into this
rank's `chunk` in place.
"""
import functools

import torch
import torch.distributed as dist

from ...comm.flat_collectives import all_gather_flat, reduce_scatter_flat
from ...comm.where import WHERE, at_work, done, forget, issued, wait_now
from ...comm.group_rendezvous import rendezvous

MAX_IN_FLIGHT = 2


class _Comm:
    in_place = False   # the staging buffer is the accumulating shard itself (nothing to send)

    def __init__(self, world, rank, group):
        self.world, self.rank, self.group = world, rank, group
        self.collectives = 0
        self.reduced = None   # the reducer's: called with a bucket once it holds this backward's sum
        self._staging = {}    # bucket index -> private staging buffer

    def begin(self):
        """A backward starts."""

    def _private(self, b):
        buf = self._staging.get(b.index)
        if buf is None:
            buf = self._staging[b.index] = b.late_buffer(self.world)   # (a zeroed staging buffer of b's shape)
        return buf

    def drain(self):
        """Every bucket launched so far has landed."""

    def in_flight_buffers(self):
        return list(self._staging.values())

    def memory(self):
        return []

    def all_gather(self, pairs, what, group=None):
        """For each (out, shard) of pairs: every rank's shard into `out` (rank-major: chunk q is rank q's; `shard`
        is this rank's, possibly out's own chunk), all launched, then waited for. `what`: the hang watch's tag
        (comm/where.py). A collective: every rank passes the same buffers' sizes in the same order."""
        for out, shard in pairs:
            self.all_gather_async(out, shard, what, group)


class LocalComm(_Comm):
    """One rank: each gradient is added straight into its shard (the whole bucket); nothing to send."""
    in_place = True
    name = "local"

    def staging(self, b, next_index):
        return b.grad_flat

    def launch(self, b):
        self.reduced(b)

    def reduce_late(self, b, buf):
        b.land(buf)
        self.reduced(b)

    def all_gather_async(self, out, shard, what, group=None):
        """The whole buffer is this rank's shard: copied unless it is out itself. Nothing to wait for (None)."""
        if shard.data_ptr() != out.data_ptr():
            out.copy_(shard)


def _collective(b, buf, group):
    """(handle, out): the async c10d reduction of `buf`, b's staging buffer, its bucket in place or a late buffer;
    b.land(out) after the handle's wait."""
    if b.staged:
        out = torch.empty(b.shard_numel, dtype=buf.dtype, device=buf.device)
        return reduce_scatter_flat(out, buf, group=group, async_op=True), out
    out = None if buf is b.flat else buf   # a late buffer: its sum is added into the bucket
    if b.chunk is not None:
        lo, hi = b.chunk
        return reduce_scatter_flat(buf[lo:hi], buf, group=group, async_op=True), out
    return dist.all_reduce(buf, group=group, async_op=True), out


def _blocking(comm, b, buf):
    """A late buffer reduced by one blocking collective of the group and landed in b."""
    handle, out = _collective(b, buf, comm.group)
    issued(handle, ("reduce", b))
    number = WHERE.issued - 1
    at_work(("reduce", b))
    handle.wait()
    done()
    if dist.get_backend(comm.group) == "gloo":   # a returned wait means finished (where.forget)
        forget(number)
    b.land(out)
    comm.collectives += 1
    comm.reduced(b)


class C10dComm(_Comm):
    name = "gloo"

    def __init__(self, world, rank, group):
        super().__init__(world, rank, group)
        self._in_flight = []   # (bucket, handle, out, staging, its number in where.issued())

    @functools.cached_property
    def _host_waits(self):
        # a returned wait means finished (where.forget); asked on first use: a transport may be made (stage 3's
        # records, zero.Init) before the process group exists
        return dist.get_backend(self.group) == "gloo"

    def staging(self, b, next_index):
        return self._private(b)

    def launch(self, b):
        staging = self._staging.pop(b.index) if b.staged else b.flat
        b.seal(staging)
        handle, out = _collective(b, staging, self.group)
        self._in_flight.append((b, issued(handle, ("reduce", b)), out, staging, WHERE.issued - 1))
        self.collectives += 1
        while len(self._in_flight) > MAX_IN_FLIGHT:
            self._finish_oldest()

    def _finish_oldest(self):
        b, handle, out, _, number = self._in_flight.pop(0)
        at_work(("reduce", b))
        handle.wait()
        done()
        if self._host_waits:
            forget(number)
        b.land(out)
        self.reduced(b)

    def drain(self):
        while self._in_flight:
            self._finish_oldest()

    def reduce_late(self, b, buf):
        _blocking(self, b, buf)

    def in_flight_buffers(self):
        return super().in_flight_buffers() + [t for b, _, out, staging, _ in self._in_flight if b.staged
                                              for t in (out, staging)]

    def all_gather(self, pairs, what, group=None):
        handles = [self.all_gather_async(out, shard, what, group) for out, shard in pairs]
        at_work(what)
        for h in handles:
            h.wait()
        done()

    def all_gather_async(self, out, shard, what, group=None):
        """The async all-gather into `out`, recorded for the hang watch under `what`; returns its work handle."""
        return issued(all_gather_flat(out, shard, group=self.group if group is None else group, async_op=True),
                      what)


def sum_rows(b, rows, rank, world):
    """Same-host ranks: `rows` [world, n] are every rank's copy of bucket b; this rank sums its chunk over them.
    Staged: added into its shard, row by row in rank order. Resident: into every row (all-reduce; rank r sums
    its 1/world share of the columns) or only its own (reduce-scatter into its chunk)."""
    if b.staged:
        lo, hi = rank * b.shard_numel, (rank + 1) * b.shard_numel
        for q in range(rows.shape[0]):
            b.grad_flat.add_(rows[q, lo:hi])
        return
    n = b.flat.numel()
    lo, hi = b.chunk if b.chunk is not None else (n * rank // world, n * (rank + 1) // world)
    if hi <= lo:
        return
    cols = rows[:, lo:hi]
    total = cols.sum(dim=0)   # (a sum into a row would alias its input)
    if b.chunk is not None:
        rows[rank, lo:hi].copy_(total)
    else:
        cols.copy_(total.expand_as(cols))


def copy_others(rows, rank):
    """Same-host ranks: `rows` [world, n] are every rank's copy of one flat buffer, whose chunk q (n / world
    elements) rank q wrote in its own row; the other ranks' chunks into this rank's row, in two strided copies."""
    world = rows.shape[0]
    blocks = rows.view(world, world, -1)   # [row, chunk, element]
    mine = blocks[rank]
    theirs = torch.diagonal(blocks, dim1=0, dim2=1).t()   # [chunk q of row q, element]
    mine[:rank].copy_(theirs[:rank])
    mine[rank + 1:].copy_(theirs[rank + 1:])


class ShmComm(_Comm):
    SLOTS = 2
    name = "shm"

    def __init__(self, buckets, world, rank, group, allocate=None, shared=None, table=None):
        """Staged buckets: allocate is a shm_reduce.SharedTable for the slots; `ok` is False when the table could
        not be made (use C10dComm). shared: the parameters' SharedParams, if any (its publishes are rendezvous
        between two backwards). Resident buckets: `table` is the one their gradient buffers live in."""
        super().__init__(world, rank, group)
        self.shared = shared
        self._epoch = None   # shared.epoch when the last backward ended with slots still being read
        self.resident = table is not None
        if self.resident:
            self.table, self.ok, self.slots = table, True, 0
            return
        self.slots = min(self.SLOTS, len(buckets))
        sizes = [0] * self.slots   # each slot as large as the largest bucket that uses it
        for b in buckets:
            sizes[b.index % self.slots] = max(sizes[b.index % self.slots], world * b.shard_numel)
        self.slot_offsets = [sum(sizes[:j]) for j in range(self.slots)]
        # the table only exists for fp32 CPU gradients (SharedTable says no to anything else: then use c10d)
        row = allocate(sum(sizes), buckets[0].grad_flat.dtype if buckets else torch.float32, torch.device("cpu"))
        self.table = allocate.table
        self.ok = self.table is not None and row.data_ptr() == self.table[rank].data_ptr()

    def _rows(self, b):
        """The bucket's columns of the table: [world, its length]."""
        if not b.staged:
            return self.table[:, b.offset:b.offset + b.flat.numel()]
        lo = self.slot_offsets[b.index % self.slots]
        return self.table[:, lo:lo + self.world * b.shard_numel]

    def begin(self):
        if self._epoch is not None and (self.shared is None or self.shared.epoch == self._epoch):
            # no publish (a step) since the last backward: its slot reads may go on
            rendezvous(self.group, ("reduce", None))
        self._epoch = None

    def _slot_free(self, b, next_index):
        # slot reused by bucket index - slots: every rank read it before arriving at that bucket's next rendezvous
        return b.index < self.slots or next_index >= b.index - self.slots + 2

    def staging(self, b, next_index):
        if b.index in self._staging or not self._slot_free(b, next_index):
            return self._private(b)
        return self._rows(b)[self.rank]

    def launch(self, b):
        early = self._staging.pop(b.index, None)
        if early is not None:   # arrived before its slot was free
            self._rows(b)[self.rank].copy_(early)
        b.seal(self._rows(b)[self.rank])
        rendezvous(self.group, ("reduce", b))   # every rank wrote this bucket (and reduced the one before)
        sum_rows(b, self._rows(b), self.rank, self.world)
        self.collectives += 1
        self.reduced(b)

    def drain(self):
        if self.resident:
            # resident rows are written by other ranks (stage 0) and read by them (both): no one may use its row
            # again (the step reads it, zero_grads zeroes it) until every rank is done with every row
            rendezvous(self.group, ("reduce", None))
            return
        # no rank may write a slot again while another still reads it: the next backward's begin() waits for
        # every rank unless a publish (the step's, a collective with two rendezvous) came in between
        self._epoch = self.shared.epoch if self.shared is not None else -1

    def reduce_late(self, b, buf):
        if not b.staged:   # the table's columns of the bucket hold its sum already: the late part goes by c10d
            _blocking(self, b, buf)
            return
        rendezvous(self.group, ("reduce", b))   # no one still reads the slots
        self._rows(b)[self.rank].copy_(buf)
        rendezvous(self.group, ("reduce", b))
        sum_rows(b, self._rows(b), self.rank, self.world)
        self.collectives += 1
        self.reduced(b)

    def memory(self):
        return [] if self.resident else [self.table[self.rank]]

    def all_gather(self, pairs, what, group=None):
        """Each `out` is a column range of this rank's row of the table (its `shard`, already there): once every
        rank wrote its chunk (one barrier for all pairs), the others' chunks are copied out of their rows. A rank
        writes its chunk again only in its next step, after the next backward's rendezvous: no one still reads."""
        columns = [self._columns(out) for out, _ in pairs]   # (a wrong buffer fails before the barrier)
        wait_now(dist.barrier(group=self.group if group is None else group, async_op=True), what)
        for rows in columns:
            copy_others(rows, self.rank)

    def all_gather_async(self, out, shard, what, group=None):
        """As all_gather, for one buffer: done when it returns (None)."""
        self.all_gather([(out, shard)], what, group)

    def _columns(self, out):
        """The table's columns that `out`, a range of this rank's row, spans: [world, out's length]."""
        row = self.table[self.rank]
        lo = (out.data_ptr() - row.data_ptr()) // row.element_size()
        if not 0 <= lo <= row.numel() - out.numel() or out.dtype != row.dtype:
            raise ValueError(f"shm all-gather on rank {self.rank}: the buffer ({out.numel()} elements of "
                             f"{out.dtype}) is not a range of this rank's row of the shared table ({row.numel()} "
                             f"elements of {row.dtype}); allocate it from the table, or gather through C10dComm")
        return self.table[:, lo:lo + out.numel()]


def gather_comm(world, rank, group=None):
    """The transport stage 3's records of `group` gather through (shared: one per group, world and rank)."""
    key = (id(group), world, rank)
    comm = _GATHER_COMMS.get(key)
    if comm is None:   # (the transport holds the group: its id is not reused while the entry exists)
        comm = _GATHER_COMMS[key] = LocalComm(world, rank, group) if world == 1 else C10dComm(world, rank, group)
    return comm


_GATHER_COMMS = {}


def comm_for(buckets, world, rank, group, allocate=None, shared=None, table=None):
    """The transport for these buckets: LocalComm on one rank; ShmComm where same-host ranks share a table (staged
    buckets: `allocate`, a shm_reduce.SharedTable, makes one; resident buckets: `table`, the one their buffers live
    in); else C10dComm. Every rank must call it alike (a shared table is agreed on by a collective)."""
    if world == 1:
        return LocalComm(world, rank, group)
    if table is not None or (allocate is not None and buckets):
        comm = ShmComm(buckets, world, rank, group, allocate, shared=shared, table=table)
        if comm.ok:
            return comm
    return C10dComm(world, rank, group)
