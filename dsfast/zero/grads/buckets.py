"""The gradient bucket layouts of every ZeRO stage: what a bucket holds, and where its reduced sum goes. The one
reduction over them (bucket order) is reducer.py's, the collectives are the transports' (transport/).

Staged (stages 2-3: each backward's gradients are written into a staging buffer whose reduce-scatter is added into
this rank's accumulating gradient shard `grad_flat`):
  ContiguousBucket  stage 2: a partition.BucketPlan, its parameters back to back and padded; rank r owns elements
                    [r * shard, (r + 1) * shard) of the bucket (its flat_shards slice)
  Bucket            stage 3: every parameter partitioned on its own (cut into buckets in reverse model order up to
                    `bucket_elems` by plan(): partition.plan_buckets, as every stage's); the staging buffer is
                    rank-major: chunk r holds, back to back, rank r's slice of each parameter's padded gradient, the
                    order of `grad_flat`, whose views are the owner's per-parameter gradient shards
Either way a plain reduce-scatter of the staging buffer hands rank r exactly its shard.
Resident (stages 0-1: the gradients accumulate in the bucket itself, a grad_buffers.Bucket):
  ResidentBucket    reduced in place: all-reduced (stage 0: every rank gets the sum) or reduce-scattered into this
                    rank's slice of its partition.BucketPlan (stage 1)
"""
import torch

from ..policy.partition import plan_buckets


class _Staged:
    """What the staged layouts share: their staging buffer is reduce-scattered (transport/transports.py), this
    rank's chunk of the sum added into grad_flat."""
    staged = True

    def land(self, out):
        self.grad_flat.add_(out)

    def late_buffer(self, world):
        """Where gradients that come after the bucket's reduction wait: a staging buffer of their own."""
        return torch.zeros(world * self.shard_numel, dtype=self.grad_flat.dtype, device=self.grad_flat.device)


class Bucket(_Staged):
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

    def _regions(self, buf, i, rec):
        """Param i's region of every rank's chunk of `buf`: a strided [world, shard] view."""
        o = self.offsets[i]
        return buf.view(rec.world, self.shard_numel)[:, o:o + rec.shard_numel]

    def scatter_into(self, buf, i, rec, flat, accumulate=False):
        """Param i's gradient (flattened, numel elements) into the rank-major staging `buf` (added to what its
        region holds when `accumulate`: padding stays as it is, zero), as one strided copy: rank r's region
        takes elements [r * shard, (r + 1) * shard) of the gradient, padded with zeros."""
        dst, s, n = self._regions(buf, i, rec), rec.shard_numel, rec.numel
        if s == 0:
            return
        whole, rest = divmod(n, s)   # ranks whose region the gradient fills, and what the next one gets
        head = flat[:whole * s].view(whole, s)
        if accumulate:
            dst[:whole].add_(head)
            if rest:
                dst[whole, :rest].add_(flat[whole * s:])
            return
        dst[:whole].copy_(head)
        if rest:
            dst[whole, :rest].copy_(flat[whole * s:])
            dst[whole, rest:].zero_()
        dst[whole + (1 if rest else 0):].zero_()

    def zero_missing(self, buf, arrived):
        """Regions of parameters whose gradient never came this backward (unused, frozen) add nothing."""
        for i, rec in self.members:
            if i not in arrived:
                self._regions(buf, i, rec).zero_()

    def seal(self, buf):
        """Before the reduction: every region was written (copy_ zeroes each region's padding)."""


class ContiguousBucket(_Staged):
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
    """Buckets over `records` (the trained parameters' records, model order): partition.plan_buckets, the planner of
    every stage, over each parameter's padded size (filled in reverse order up to `bucket_elems`)."""
    n = len(records)
    plans = plan_buckets([r.padded for r in records], [0] * n, [None] * n, bucket_elems, world)
    return [Bucket(p.index, [(e.param, records[e.param]) for e in p.entries], world, dtype, device) for p in plans]


class ResidentBucket:
    """Stages 0-1: a grad_buffers.Bucket reduced where it is. `chunk` = (lo, hi): stage 1's slice of the plan
    (reduce-scatter: only this rank's slice gets the sum; the rest keeps what this rank sent), None for stage 0
    (all-reduce; same-host ranks then sum a 1/world share each). members: [(param index, (offset, numel))]."""
    staged = False

    def __init__(self, bucket, members, chunk=None):
        self.index = bucket.index
        self.flat = bucket.flat
        self.offset = bucket.offset   # where it starts in the shared table, when there is one
        self.members = members
        self.offsets = dict(members)
        self.chunk = chunk

    def late_buffer(self, world):
        """Where gradients that come after the bucket's reduction wait (its shape: reduced like the bucket)."""
        return torch.zeros_like(self.flat)

    def scatter_into(self, buf, i, rec, flat, accumulate=False):
        """Into the bucket itself: nothing to do (grad_buffers put it there, flat is None); into a late buffer:
        at the parameter's offset."""
        if flat is None:
            return
        o, n = self.offsets[i]
        dst = buf[o:o + n]
        dst.add_(flat) if accumulate else dst.copy_(flat)

    def zero_missing(self, buf, arrived):
        """A parameter without a gradient this backward still sends what it accumulated before."""

    def seal(self, buf):
        """The padding is zero for good."""

    def land(self, out):
        """In place: nothing to add. A late buffer: reduced in our slice (all of it for stage 0), this rank's own
        gradients elsewhere (what the bucket keeps there too)."""
        if out is not None:
            self.flat.add_(out)
