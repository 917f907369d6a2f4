"""The one gradient reduction of every ZeRO stage: buckets reduced in bucket order as soon as they are complete,
over one of three transports. What a bucket holds and where its sum goes is the bucket layout's (grad_buckets.py):

  staged buckets    stages 2-3: each backward's gradients are written into a staging buffer that is reduce-scattered
                    and added into this rank's accumulating gradient shards
  resident buckets  stages 0-1: the gradients already accumulate in the bucket (grad_buffers.py), which is reduced
                    in place: all-reduced (stage 0) or reduce-scattered into this rank's slice (stage 1)

A bucket is reduced when every one of its parameters' gradients arrived and every earlier bucket was (in bucket
order on every rank, whatever the arrival order: the same buckets meet in every collective); then
`on_reduced(bucket)` runs (the offload copy to the host, where the placement asks for it).

Three transports (`transport` names the one in use):
  LocalReducer "local"  one rank: staged gradients are added straight into the shards, nothing is sent
  GlooReducer  "gloo"   an async collective per bucket (at most MAX_IN_FLIGHT running), any backend
  ShmReducer   "shm"    same-host CPU ranks: the buffers are columns of a /dev/shm table [world, n] (row q = what
                        rank q wrote). Reducing a bucket is a rendezvous, then rank r sums its chunk over every row.
                        Resident buckets live in the table for good (the gradient buffers were allocated there);
                        staged ones use two reused slots: a slot is reused two buckets later, by when every rank
                        passed the next bucket's rendezvous, so no one still reads it; a gradient that arrives
                        before its slot is free waits in a private buffer. The next backward writes slots again
                        only after a rendezvous: the step's publish (shared_params.py) or its own.
"""
import torch

from ..comm.where import at, done
from .shared_params import rendezvous

MAX_IN_FLIGHT = 2


class Reducer:
    in_place = False   # LocalReducer: the staging buffer is the accumulating shard itself
    transport = None

    def __init__(self, buckets, world, rank, group):
        self.buckets = buckets
        self.world, self.rank, self.group = world, rank, group
        self.bucket_of = {i: b for b in buckets for i, _ in b.members}
        self.collectives_launched = 0
        self._next = 0
        self._arrived = {}    # bucket index -> set of param indices whose gradient arrived
        self._staging = {}    # bucket index -> private staging buffer
        self._late = {}       # bucket index -> gradients that came after the bucket was reduced (see add)
        self.on_reduced = None   # called with a bucket once it holds this backward's reduced sum

    def begin(self):
        self._next = 0
        self._arrived.clear()
        self._late.clear()

    def reduced(self, i):
        """Param i's bucket was reduced in this backward already."""
        return self.bucket_of[i].index < self._next

    def add(self, i, rec, flat):
        """Param i's gradient of this backward (flattened; None for a resident bucket, which holds it already);
        launches every bucket that became complete.

        A parameter's gradient can come twice in one backward (reentrant activation checkpointing runs a nested
        backward: a parameter used inside and outside the checkpoint accumulates in both). Before its bucket was
        reduced the second one is added in; after, it waits in a private buffer (`flat` given, also for a resident
        bucket) that end() reduces on its own and adds into the bucket's sum."""
        b = self.bucket_of[i]
        if b.index < self._next:
            if b.index not in self._late:
                self._late[b.index] = b.late_buffer(self.world)
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
        """Buckets some of whose parameters got no gradient (staged: zeros there; every rank runs the same
        collectives, whatever reached it), then wait for everything."""
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if not self.in_place:
                b.zero_missing(self._buffer(b), self._arrived.get(b.index, ()))
            self._launch(b)
        self._drain()
        for index in sorted(self._late):   # the same on every rank: every rank runs the same backward graph
            self._reduce_late(self.buckets[index], self._late.pop(index))

    def _buffer(self, b):
        """Where b's gradients of this backward go: a resident bucket holds them already."""
        return self._staging_of(b) if b.staged else b.flat

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


class LocalReducer(Reducer):
    """One rank: each gradient is added straight into its shard (the whole bucket); nothing to send."""
    in_place = True
    transport = "local"

    def _staging_of(self, b):
        return b.grad_flat

    def _launch(self, b):
        self._next += 1
        self._reduced(b)

    def _reduce_late(self, b, buf):
        b.land(buf)
        self._reduced(b)


class GlooReducer(Reducer):
    transport = "gloo"

    def __init__(self, buckets, world, rank, group):
        super().__init__(buckets, world, rank, group)
        self._in_flight = []   # (bucket, handle, out, staging)

    def _staging_of(self, b):
        return self._private(b)

    def _launch(self, b):
        staging = self._staging.pop(b.index) if b.staged else b.flat
        b.seal(staging)
        handle, out = b.launch_collective(staging, self.rank, self.group)
        self._in_flight.append((b, handle, out, staging))
        self.collectives_launched += 1
        self._next += 1
        while len(self._in_flight) > MAX_IN_FLIGHT:
            self._finish_oldest()

    def _finish_oldest(self):
        b, handle, out, _ = self._in_flight.pop(0)
        at(("reduce", b))
        handle.wait()
        done()
        b.land(out)
        self._reduced(b)

    def _drain(self):
        while self._in_flight:
            self._finish_oldest()

    def _reduce_late(self, b, buf):
        _reduce_late_by_collective(self, b, buf)

    def in_flight_buffers(self):
        return super().in_flight_buffers() + [t for b, _, out, staging in self._in_flight if b.staged
                                              for t in (out, staging)]


class ShmReducer(Reducer):
    SLOTS = 2
    transport = "shm"

    def __init__(self, buckets, world, rank, group, allocate=None, shared=None, table=None):
        """Staged buckets: allocate is a shm_reduce.SharedTable for the slots; `ok` is False when the table could
        not be made (use GlooReducer). shared: the parameters' SharedParams, if any (its publishes are rendezvous
        between two backwards). Resident buckets: `table` is the one their gradient buffers live in."""
        super().__init__(buckets, world, rank, group)
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
        # the table only exists for fp32 CPU gradients (SharedTable says no to anything else: then use gloo)
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
        super().begin()
        if self._epoch is not None and (self.shared is None or self.shared.epoch == self._epoch):
            at(("reduce", None))
            rendezvous(self.group)   # no publish (a step) since the last backward: its slot reads may go on
            done()
        self._epoch = None

    def _slot_free(self, b):
        # slot reused by bucket index - slots: every rank read it before arriving at that bucket's next rendezvous
        return b.index < self.slots or self._next >= b.index - self.slots + 2

    def _staging_of(self, b):
        if b.index in self._staging or not self._slot_free(b):
            return self._private(b)
        return self._rows(b)[self.rank]

    def _launch(self, b):
        early = self._staging.pop(b.index, None)
        if early is not None:   # arrived before its slot was free
            self._rows(b)[self.rank].copy_(early)
        b.seal(self._rows(b)[self.rank])
        at(("reduce", b))
        rendezvous(self.group)   # every rank wrote this bucket (and reduced the one before)
        done()
        b.reduce_rows(self._rows(b), self.rank)
        self.collectives_launched += 1
        self._next += 1
        self._reduced(b)

    def _drain(self):
        if self.resident:
            # resident rows are written by other ranks (stage 0) and read by them (both): no one may use its row
            # again (the step reads it, zero_grads zeroes it) until every rank is done with every row
            at(("reduce", None))
            rendezvous(self.group)
            done()
            return
        # no rank may write a slot again while another still reads it: the next backward's begin() waits for
        # every rank unless a publish (the step's, a collective with two rendezvous) came in between
        self._epoch = self.shared.epoch if self.shared is not None else -1

    def _reduce_late(self, b, buf):
        if not b.staged:   # the table's columns of the bucket hold its sum already: the late part goes by c10d
            _reduce_late_by_collective(self, b, buf)
            return
        at(("reduce", b))
        rendezvous(self.group)   # no one still reads the slots
        self._rows(b)[self.rank].copy_(buf)
        rendezvous(self.group)
        done()
        b.reduce_rows(self._rows(b), self.rank)
        self.collectives_launched += 1
        self._reduced(b)

    def memory(self):
        return [] if self.resident else [self.table[self.rank]]


def _reduce_late_by_collective(reducer, b, buf):
    """A late buffer reduced by one blocking collective of the reducer's group and added into b's sum."""
    handle, out = b.launch_collective(buf, reducer.rank, reducer.group)
    at(("reduce", b))
    handle.wait()
    done()
    b.land(out)
    reducer.collectives_launched += 1
    reducer._reduced(b)


def reducer_for(buckets, world, rank, group, allocate=None, shared=None, table=None):
    """The transport for these buckets: LocalReducer on one rank; ShmReducer where same-host ranks share a table
    (staged buckets: `allocate`, a shm_reduce.SharedTable, makes one; resident buckets: `table`, the one their
    buffers live in); else GlooReducer. Every rank must call it alike (a shared table is agreed on by a
    collective)."""
    if world == 1:
        return LocalReducer(buckets, world, rank, group)
    if table is not None or (allocate is not None and buckets):
        reducer = ShmReducer(buckets, world, rank, group, allocate, shared=shared, table=table)
        if reducer.ok:
            return reducer
    return GlooReducer(buckets, world, rank, group)
