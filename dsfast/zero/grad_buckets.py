"""The gradient reduction of ZeRO stages 2 and 3: each backward's gradients reduce-scattered in buckets into the
shards that accumulate them, one reduce-scatter for many parameters.

Two bucket layouts, one reduction over them:
  ContiguousBucket  stage 2: a partition.BucketPlan, its parameters back to back and padded; rank r owns elements
                    [r * shard, (r + 1) * shard) of the bucket (its flat_shards slice)
  Bucket            stage 3: every parameter partitioned on its own (cut into buckets in reverse model order up to
                    `bucket_elems` by plan()); the staging buffer is rank-major: chunk r holds, back to back, rank
                    r's slice of each parameter's padded gradient, the order of `grad_flat`, whose views are the
                    owner's per-parameter gradient shards
Either way a plain reduce-scatter of the staging buffer hands rank r exactly its shard. A bucket is reduced when all
of its parameters' gradients arrived and every earlier bucket was (in bucket order on every rank, whatever the
arrival order: the same buckets meet in every collective); then `on_reduced(bucket)` runs (the offload copy to the
host, where the placement asks for it).

Three transports:
  LocalBuckets one rank: gradients are added straight into the shards, nothing is staged or sent
  GlooBuckets  an async reduce-scatter per bucket (at most MAX_IN_FLIGHT running), any backend
  ShmBuckets   same-host CPU ranks: the staging buffers are slots of a /dev/shm table [world, the slots'
               sizes] (row q = what rank q wrote; a slot fits the largest bucket that uses it). Reducing a bucket
               is a rendezvous, then rank r sums chunk r over every row into its shards. A slot is reused two
               buckets later: by then every rank passed the next bucket's rendezvous, so no one still reads it; a
               gradient that arrives before its slot is free waits in a private buffer. The next backward
               writes slots again only after a rendezvous: the step's publish (shared_params.py) or its own.
"""
import torch

from ..comm.flat_collectives import reduce_scatter_flat
from .shared_params import rendezvous

MAX_IN_FLIGHT = 2


class Bucket:
    """Stage 3's rank-major bucket over partitioned parameters (members: [(param index, record)])."""

    def __init__(self, index, members, world, dtype, device):
        self.index = index
        self.members = members
        self.offsets = {}                          # param index -> offset of its shard within a chunk
        off = 0
        for i, rec in members:
            self.offsets[i] = off
            off += rec.shard_numel
        self.shard_numel = off
        self.grad_flat = torch.zeros(off, dtype=dtype, device=device)

    def grad_view(self, i, rec):
        o = self.offsets[i]
        return self.grad_flat[o:o + rec.shard_numel]

    def scatter_into(self, buf, i, rec, flat, accumulate=False):
        """Param i's gradient (flattened, numel elements) into the rank-major staging `buf` (added to what its
        region holds when `accumulate`: padding stays as it is, zero)."""
        o, s, n = self.offsets[i], rec.shard_numel, rec.numel
        for r in range(rec.world):
            dst = buf[r * self.shard_numel + o:r * self.shard_numel + o + s]
            a, b = r * s, min((r + 1) * s, n)
            if accumulate:
                if a < b:
                    dst[:b - a].add_(flat[a:b])
            elif a < b:
                dst[:b - a].copy_(flat[a:b])
                if b - a < s:
                    dst[b - a:].zero_()
            else:
                dst.zero_()

    def zero_missing(self, buf, arrived):
        """Regions of parameters whose gradient never came this backward (unused, frozen) add nothing."""
        for i, rec in self.members:
            if i not in arrived:
                o = self.offsets[i]
                for r in range(rec.world):
                    buf[r * self.shard_numel + o:r * self.shard_numel + o + rec.shard_numel].zero_()

    def seal(self, buf):
        """Before the reduction: every region was written (copy_ zeroes each region's padding)."""


class ContiguousBucket:
    """Stage 2's bucket: a partition.BucketPlan (members: [(param index, Entry)]); grad_flat is this rank's
    gradient shard of it."""

    def __init__(self, plan, grad_flat):
        self.index = plan.index
        self.members = [(e.param, e) for e in plan.entries]
        self.numel = plan.numel
        self.shard_numel = plan.shard
        self.grad_flat = grad_flat

    def scatter_into(self, buf, i, e, flat, accumulate=False):
        dst = buf[e.offset:e.offset + e.numel]
        dst.add_(flat) if accumulate else dst.copy_(flat)

    def zero_missing(self, buf, arrived):
        for i, e in self.members:
            if i not in arrived:
                buf[e.offset:e.offset + e.numel].zero_()

    def seal(self, buf):
        """The padding adds nothing (a reused shared-memory slot holds an earlier bucket's values there)."""
        buf[self.numel:].zero_()


def plan(records, bucket_elems, world, dtype, device):
    """Buckets over `records` (the trained parameters' records, model order), filled in reverse order."""
    out, pending, used = [], [], 0
    for i in reversed(range(len(records))):
        rec = records[i]
        if pending and used + rec.padded > bucket_elems:
            out.append(Bucket(len(out), pending, world, dtype, device))
            pending, used = [], 0
        pending.append((i, rec))
        used += rec.padded
    if pending:
        out.append(Bucket(len(out), pending, world, dtype, device))
    return out


class _Buckets:
    in_place = False   # LocalBuckets: the staging buffer is the accumulating shard itself

    def __init__(self, buckets, world, rank, group):
        self.buckets = buckets
        self.world, self.rank, self.group = world, rank, group
        self.bucket_of = {i: b for b in buckets for i, _ in b.members}
        self.collectives_launched = 0
        self._next = 0
        self._arrived = {}    # bucket index -> set of param indices whose gradient arrived
        self._staging = {}    # bucket index -> private staging buffer
        self._late = {}       # bucket index -> gradients that came after the bucket was reduced (see add)
        self.on_reduced = None   # called with a bucket once its shards hold this backward's reduced sum

    def begin(self):
        self._next = 0
        self._arrived.clear()
        self._late.clear()

    def add(self, i, rec, flat):
        """Param i's gradient of this backward (flattened); launches every bucket that became complete.

        A parameter's gradient can come twice in one backward (reentrant activation checkpointing runs a nested
        backward: a parameter used inside and outside the checkpoint accumulates in both). Before its bucket was
        reduced the second one is added in; after, it waits in a private buffer that end() reduces on its own."""
        b = self.bucket_of[i]
        if b.index < self._next:
            if b.index not in self._late:
                self._late[b.index] = torch.zeros(self.world * b.shard_numel, dtype=b.grad_flat.dtype,
                                                  device=b.grad_flat.device)
            b.scatter_into(self._late[b.index], i, rec, flat, accumulate=True)
            return
        got = self._arrived.setdefault(b.index, set())
        again = i in got
        b.scatter_into(self._buffer(b), i, rec, flat, accumulate=again or self.in_place)
        if again:
            return
        got.add(i)
        while self._next < len(self.buckets) and \
                len(self._arrived.get(self._next, ())) == len(self.buckets[self._next].members):
            self._launch(self.buckets[self._next])

    def end(self):
        """Buckets some of whose parameters got no gradient (zeros there: every rank runs the same collectives,
        whatever reached it), then wait for everything."""
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if not self.in_place:
                b.zero_missing(self._buffer(b), self._arrived.get(b.index, ()))
            self._launch(b)
        self._drain()
        for index in sorted(self._late):   # the same on every rank: every rank runs the same backward graph
            self._reduce_late(self.buckets[index], self._late.pop(index))

    def _private(self, b):
        buf = self._staging.get(b.index)
        if buf is None:
            buf = self._staging[b.index] = torch.zeros(self.world * b.shard_numel, dtype=b.grad_flat.dtype,
                                                       device=b.grad_flat.device)
        return buf

    def _drain(self):
        pass

    def _reduced(self, b):
        if self.on_reduced is not None:
            self.on_reduced(b)

    def in_flight_buffers(self):
        return list(self._staging.values()) + list(self._late.values())


class LocalBuckets(_Buckets):
    """One rank: each gradient is added straight into its shard (the whole bucket); nothing to send."""
    in_place = True

    def _buffer(self, b):
        return b.grad_flat

    def _launch(self, b):
        self._reduced(b)
        self._next += 1

    def _reduce_late(self, b, buf):
        b.grad_flat.add_(buf)
        self._reduced(b)


def reducer_for(buckets, world, rank, group, allocate=None, shared=None):
    """The transport for these buckets: LocalBuckets on one rank, ShmBuckets where `allocate` (a
    shm_reduce.SharedTable) gives same-host ranks a shared table, else GlooBuckets. Every rank must call it alike
    (the shared table is agreed on by a collective)."""
    if world == 1:
        return LocalBuckets(buckets, world, rank, group)
    if allocate is not None and buckets:
        reducer = ShmBuckets(buckets, world, rank, group, allocate, shared=shared)
        if reducer.ok:
            return reducer
    return GlooBuckets(buckets, world, rank, group)


class GlooBuckets(_Buckets):
    def __init__(self, buckets, world, rank, group):
        super().__init__(buckets, world, rank, group)
        self._in_flight = []   # (bucket, handle, out, staging)

    def _buffer(self, b):
        return self._private(b)

    def _launch(self, b):
        staging = self._staging.pop(b.index)
        b.seal(staging)
        out = torch.empty(b.shard_numel, dtype=staging.dtype, device=staging.device)
        handle = reduce_scatter_flat(out, staging, group=self.group, async_op=True)
        self._in_flight.append((b, handle, out, staging))
        self.collectives_launched += 1
        self._next += 1
        while len(self._in_flight) > MAX_IN_FLIGHT:
            self._finish_oldest()

    def _finish_oldest(self):
        b, handle, out, _ = self._in_flight.pop(0)
        handle.wait()
        b.grad_flat.add_(out)
        self._reduced(b)

    def _drain(self):
        while self._in_flight:
            self._finish_oldest()

    def _reduce_late(self, b, buf):
        out = torch.empty(b.shard_numel, dtype=buf.dtype, device=buf.device)
        reduce_scatter_flat(out, buf, group=self.group)
        b.grad_flat.add_(out)
        self._reduced(b)
        self.collectives_launched += 1

    def in_flight_buffers(self):
        return super().in_flight_buffers() + [t for _, _, out, staging in self._in_flight for t in (out, staging)]


class ShmBuckets(_Buckets):
    SLOTS = 2

    def __init__(self, buckets, world, rank, group, allocate, shared=None):
        """allocate: a shm_reduce.SharedTable; `ok` is False when the table could not be made (use GlooBuckets).
        shared: the parameters' SharedParams, if any (its publishes are rendezvous between two backwards)."""
        super().__init__(buckets, world, rank, group)
        self.shared = shared
        self._epoch = None   # shared.epoch when the last backward ended with slots still being read
        self.slots = min(self.SLOTS, len(buckets))
        sizes = [0] * self.slots   # each slot as large as the largest bucket that uses it
        for b in buckets:
            sizes[b.index % self.slots] = max(sizes[b.index % self.slots], world * b.shard_numel)
        self.slot_offsets = [sum(sizes[:j]) for j in range(self.slots)]
        # the table only exists for fp32 CPU gradients (SharedTable says no to anything else: then use gloo)
        row = allocate(sum(sizes), buckets[0].grad_flat.dtype if buckets else torch.float32, torch.device("cpu"))
        self.table = allocate.table
        self.ok = self.table is not None and row.data_ptr() == self.table[rank].data_ptr()

    def _slot(self, b, q):
        lo = self.slot_offsets[b.index % self.slots]
        return self.table[q, lo:lo + self.world * b.shard_numel]

    def begin(self):
        super().begin()
        if self._epoch is not None and (self.shared is None or self.shared.epoch == self._epoch):
            rendezvous(self.group)   # no publish (a step) since the last backward: its slot reads may go on
        self._epoch = None

    def _slot_free(self, b):
        # slot reused by bucket index - slots: every rank read it before arriving at that bucket's next rendezvous
        return b.index < self.slots or self._next >= b.index - self.slots + 2

    def _buffer(self, b):
        if b.index in self._staging or not self._slot_free(b):
            return self._private(b)
        return self._slot(b, self.rank)

    def _launch(self, b):
        early = self._staging.pop(b.index, None)
        if early is not None:   # arrived before its slot was free
            self._slot(b, self.rank).copy_(early)
        b.seal(self._slot(b, self.rank))
        rendezvous(self.group)   # every rank wrote this bucket (and reduced the one before)
        lo, hi = self.rank * b.shard_numel, (self.rank + 1) * b.shard_numel
        for q in range(self.world):
            b.grad_flat.add_(self._slot(b, q)[lo:hi])
        self._reduced(b)
        self.collectives_launched += 1
        self._next += 1

    def _drain(self):
        # no rank may write a slot again while another still reads it: the next backward's begin() waits for
        # every rank unless a publish (the step's, a collective with two rendezvous) came in between
        self._epoch = self.shared.epoch if self.shared is not None else -1

    def _reduce_late(self, b, buf):
        rendezvous(self.group)   # no one still reads the slots
        self._slot(b, self.rank).copy_(buf)
        rendezvous(self.group)
        lo, hi = self.rank * b.shard_numel, (self.rank + 1) * b.shard_numel
        for q in range(self.world):
            b.grad_flat.add_(self._slot(b, q)[lo:hi])
        self._reduced(b)
        self.collectives_launched += 1

    def memory(self):
        return [self.table[self.rank]]
