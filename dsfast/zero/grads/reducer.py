"""The one gradient reduction of every ZeRO stage: buckets reduced in bucket order as soon as they are complete,
over one transport (transport/transports.py: one rank, c10d collectives, or the same-host /dev/shm table). What a bucket
holds and where its sum goes is the bucket layout's (grad_buckets.py):

  staged buckets    stages 2-3: each backward's gradients are written into a staging buffer that is reduce-scattered
                    and added into this rank's accumulating gradient shards
  resident buckets  stages 0-1: the gradients already accumulate in the bucket (grad_buffers.py), which is reduced
                    in place: all-reduced (stage 0) or reduce-scattered into this rank's slice (stage 1)

A bucket is reduced when every one of its parameters' gradients arrived and every earlier bucket was (in bucket
order on every rank, whatever the arrival order: the same buckets meet in every collective); then
`on_reduced(bucket)` runs (the offload copy to the host, where the placement asks for it).
"""
from ..transport.transports import comm_for


class Reducer:
    def __init__(self, buckets, comm):
        self.buckets = buckets
        self.comm = comm
        comm.reduced = self._reduced
        self.bucket_of = {i: b for b in buckets for i, _ in b.members}
        self._next = 0
        self._arrived = {}    # bucket index -> set of param indices whose gradient arrived
        self._late = {}       # bucket index -> gradients that came after the bucket was reduced (see add)
        self.on_reduced = None   # called with a bucket once it holds this backward's reduced sum

    @property
    def transport(self):
        """The transport's name: "local", "gloo" or "shm"."""
        return self.comm.name

    @property
    def collectives_launched(self):
        return self.comm.collectives

    def begin(self):
        self._next = 0
        self._arrived.clear()
        self._late.clear()
        self.comm.begin()

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
                self._late[b.index] = b.late_buffer(self.comm.world)
            b.scatter_into(self._late[b.index], i, rec, flat, accumulate=True)
            return
        got = self._arrived.setdefault(b.index, set())
        again = i in got
        b.scatter_into(self._buffer(b), i, rec, flat, accumulate=again or self.comm.in_place)
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
            if not self.comm.in_place:
                b.zero_missing(self._buffer(b), self._arrived.get(b.index, ()))
            self._launch(b)
        self.comm.drain()
        for index in sorted(self._late):   # the same on every rank: every rank runs the same backward graph
            self.comm.reduce_late(self.buckets[index], self._late.pop(index))

    def _launch(self, b):
        self.comm.launch(b)
        self._next += 1

    def _buffer(self, b):
        """Where b's gradients of this backward go: a resident bucket holds them already."""
        return self.comm.staging(b, self._next) if b.staged else b.flat

    def _reduced(self, b):
        if self.on_reduced is not None:
            self.on_reduced(b)

    def in_flight_buffers(self):
        return self.comm.in_flight_buffers() + list(self._late.values())

    def memory(self):
        """Transport memory held for good (the /dev/shm slots of staged buckets)."""
        return self.comm.memory()


def reducer_for(buckets, world, rank, group, allocate=None, shared=None, table=None):
    """The reduction of these buckets over the transport transports.comm_for picks (every rank must call it
    alike)."""
    return Reducer(buckets, comm_for(buckets, world, rank, group, allocate, shared=shared, table=table))
