"""grad_buckets' layout maths, in one process: buckets in reverse order under the cap, and a rank-major staging
buffer whose chunk r, summed over ranks, is exactly rank r's padded slice of each parameter's summed gradient."""
import torch

from dsfast.zero import grad_buckets
from dsfast.zero.partitioned_param import PartitionedParam


def _records(sizes, world, rank=0):
    return [PartitionedParam(torch.nn.Parameter(torch.zeros(n)), world, rank) for n in sizes]


def test_buckets_take_parameters_in_reverse_order_up_to_the_cap():
    recs = _records([100, 40, 7, 300, 5], world=2)   # padded to 128, 64, 32, 320, 32 elements
    buckets = grad_buckets.plan(recs, 230, 2, torch.float32, torch.device("cpu"))
    assert [[i for i, _ in b.members] for b in buckets] == [[4], [3], [2, 1, 0]]   # 320 > cap: alone
    assert [b.shard_numel for b in buckets] == [16, 160, 16 + 32 + 64]
    assert [b.index for b in buckets] == [0, 1, 2]


def test_rank_major_staging_reduces_to_each_ranks_slices():
    world = 3
    sizes = [50, 3, 97]
    recs = _records(sizes, world)
    bucket = grad_buckets.plan(recs, 10_000, world, torch.float32, torch.device("cpu"))[0]
    gen = torch.Generator().manual_seed(0)
    grads = [[torch.randn(n, generator=gen) for n in sizes] for _ in range(world)]   # [rank q][param]
    bufs = []
    for q in range(world):
        buf = torch.full((world * bucket.shard_numel,), float("nan"))   # every element must be written
        for i, rec in bucket.members:
            grad_buckets.scatter_into(buf, bucket, i, rec, grads[q][i])
        bufs.append(buf)
    for r in range(world):   # what a reduce-scatter hands rank r
        chunk = sum(b[r * bucket.shard_numel:(r + 1) * bucket.shard_numel] for b in bufs)
        for i, rec in bucket.members:
            total = torch.zeros(rec.padded)
            total[:rec.numel] = sum(g[i] for g in grads)
            o = bucket.offsets[i]
            assert torch.equal(chunk[o:o + rec.shard_numel], total[r * rec.shard_numel:(r + 1) * rec.shard_numel])


def test_parameters_without_a_gradient_add_zeros():
    recs = _records([20, 30], world=2)
    bucket = grad_buckets.plan(recs, 10_000, 2, torch.float32, torch.device("cpu"))[0]
    buf = torch.full((2 * bucket.shard_numel,), 9.0)
    grad_buckets.scatter_into(buf, bucket, 1, recs[1], torch.ones(30))
    grad_buckets.zero_missing(buf, bucket, {1})
    o = bucket.offsets[0]
    for r in range(2):
        base = r * bucket.shard_numel
        assert torch.equal(buf[base + o:base + o + recs[0].shard_numel], torch.zeros(recs[0].shard_numel))
    assert buf.sum().item() == 30.0


def test_gradient_shards_are_views_of_the_bucket():
    recs = _records([20, 30], world=2)
    bucket = grad_buckets.plan(recs, 10_000, 2, torch.float32, torch.device("cpu"))[0]
    bucket.grad_flat.add_(1.0)
    for i, rec in bucket.members:
        v = bucket.grad_view(i, rec)
        assert v.numel() == rec.shard_numel and v.data_ptr() >= bucket.grad_flat.data_ptr()
        assert torch.equal(v, torch.ones(rec.shard_numel))
