"""grad_buckets' layout maths, the one reducer and the /dev/shm transport's row sums, in one process: stage 3's buckets in reverse order under the cap
with a rank-major staging buffer whose chunk r, summed over ranks, is exactly rank r's padded slice of each
parameter's summed gradient; stage 2's contiguous buckets; stages 0-1's resident buckets reduced through the table."""
import torch

from dsfast.zero.grads import buckets as grad_buckets
from dsfast.zero.params.partitioned_param import PartitionedParam
from dsfast.zero.grads.reducer import reducer_for
from dsfast.zero.transport.transports import sum_rows


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
            bucket.scatter_into(buf, i, rec, grads[q][i])
        bufs.append(buf)
    for r in range(world):   # what a reduce-scatter hands rank r
        chunk = sum(b[r * bucket.shard_numel:(r + 1) * bucket.shard_numel] for b in bufs)
        for i, rec in bucket.members:
            total = torch.zeros(rec.padded)
            total[:rec.numel] = sum(g[i] for g in grads)
            o = bucket.offsets[i]
            assert torch.equal(chunk[o:o + rec.shard_numel], total[r * rec.shard_numel:(r + 1) * rec.shard_numel])


def test_a_second_gradient_is_added_into_every_ranks_region_and_the_padding_stays_zero():
    world, sizes = 3, [50, 3, 97]   # 3: only rank 0's region holds gradient, the rest is padding
    recs = _records(sizes, world)
    bucket = grad_buckets.plan(recs, 10_000, world, torch.float32, torch.device("cpu"))[0]
    gen = torch.Generator().manual_seed(1)
    first, second = ([torch.randn(n, generator=gen) for n in sizes] for _ in range(2))
    once, twice = (torch.full((world * bucket.shard_numel,), float("nan")) for _ in range(2))
    for i, rec in bucket.members:
        bucket.scatter_into(once, i, rec, first[i] + second[i])
        bucket.scatter_into(twice, i, rec, first[i])
        bucket.scatter_into(twice, i, rec, second[i], accumulate=True)
    torch.testing.assert_close(twice, once, atol=1e-6, rtol=0)
    assert not torch.isnan(twice).any()


def test_one_rank_resident_bucket_adds_a_gradient_that_came_after_its_reduction():
    # stages 0-1: a layer reused inside a reentrant checkpoint gives its bucket a gradient after the reduction
    table, (b,) = _resident(1)
    b.flat.zero_()
    reducer = reducer_for([b], 1, 0, None)
    done = []
    reducer.on_reduced = lambda bucket: done.append(bucket.index)
    reducer.begin()
    b.flat.fill_(1.0)                                  # both gradients are in the bucket (grad_buffers put them)
    reducer.add(0, None, None)
    reducer.add(1, None, None)
    assert reducer.reduced(1) and done == [0]
    reducer.add(1, None, torch.full((12,), 2.0))      # late: not onto the reduced sum now, but at end()
    assert torch.equal(b.flat, torch.ones(37))
    reducer.end()
    assert done == [0, 0]
    assert torch.equal(b.flat[:25], torch.ones(25)) and torch.equal(b.flat[25:], torch.full((12,), 3.0))


def test_parameters_without_a_gradient_add_zeros():
    recs = _records([20, 30], world=2)
    bucket = grad_buckets.plan(recs, 10_000, 2, torch.float32, torch.device("cpu"))[0]
    buf = torch.full((2 * bucket.shard_numel,), 9.0)
    bucket.scatter_into(buf, 1, recs[1], torch.ones(30))
    bucket.zero_missing(buf, {1})
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


def test_contiguous_buckets_reduce_to_each_ranks_slice_and_seal_their_padding():
    # stage 2's layout: the plan's parameters back to back, padded; rank r's shard is its slice of the sum
    from dsfast.zero.policy.partition import plan_buckets
    world, sizes = 3, [50, 3, 97]
    plan = plan_buckets(sizes, [0] * 3, [("cpu",)] * 3, 10_000, world)[0]
    bucket = grad_buckets.ContiguousBucket(plan, torch.zeros(plan.shard))
    gen = torch.Generator().manual_seed(0)
    grads = [[torch.randn(n, generator=gen) for n in sizes] for _ in range(world)]
    bufs = []
    for q in range(world):
        buf = torch.full((plan.padded,), float("nan"))   # a reused slot: padding holds garbage until sealed
        for i, e in bucket.members:
            bucket.scatter_into(buf, i, e, grads[q][i])
        bucket.seal(buf)
        bufs.append(buf)
    total = torch.zeros(plan.padded)
    for i, e in bucket.members:
        total[e.offset:e.offset + e.numel] = sum(g[i] for g in grads)
    for r in range(world):
        lo, hi = plan.shard_range(r)
        assert torch.equal(sum(b[lo:hi] for b in bufs), total[lo:hi])
    buf = torch.full((plan.padded,), 5.0)
    bucket.zero_missing(buf, {bucket.members[0][0]})
    e0 = bucket.members[0][1]
    assert buf.sum().item() == 5.0 * e0.numel + 5.0 * (plan.padded - plan.numel)   # only the missing ones zeroed


def test_one_rank_adds_gradients_straight_into_the_shards():
    recs = _records([20, 30], world=1)
    buckets = grad_buckets.plan(recs, 10_000, 1, torch.float32, torch.device("cpu"))
    reducer = reducer_for(buckets, 1, 0, None)
    done = []
    reducer.on_reduced = lambda b: done.append(b.index)
    for micro in range(2):   # gradients accumulate across micro-steps
        reducer.begin()
        reducer.add(1, recs[1], torch.ones(30))
        reducer.add(0, recs[0], torch.full((20,), 2.0))
        reducer.add(0, recs[0], torch.full((20,), 1.0))   # reentrant checkpointing: the same gradient twice
        reducer.end()
    # each backward: reduced when complete, then again when the late (reentrant) gradient is added
    assert reducer.transport == "local" and done == [0, 0, 0, 0]
    assert torch.equal(buckets[0].grad_view(0, recs[0])[:20], torch.full((20,), 6.0))
    assert torch.equal(buckets[0].grad_view(1, recs[1])[:30], torch.full((30,), 2.0))


def _resident(world, chunks=None, numel=37):
    """One resident bucket per rank over the same parameters (grad_buffers' layout), rows of one table."""
    from dsfast.zero.grads.buffers import GradBuffers
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (numel - 12, 12)]
    table = torch.stack([torch.randn(numel) for _ in range(world)])
    rows, out = [], []
    for r in range(world):
        buffers = GradBuffers(params, [(params, numel)], grads_are_views=True,
                              allocate=lambda n, d, dev, r=r: table[r, :n])
        b = buffers.buckets[0]
        rows.append(grad_buckets.ResidentBucket(b, [(0, (0, numel - 12)), (1, (numel - 12, 12))],
                                                chunks[r] if chunks else None))
    return table, rows


def test_resident_bucket_all_reduce_through_the_table_leaves_the_sum_in_every_row():
    # stage 0 on same-host ranks: each rank sums its 1/world share of columns over every row, into every row
    for world in (2, 3, 4):
        table, buckets = _resident(world)
        total = table.sum(dim=0)
        for r, b in enumerate(buckets):
            sum_rows(b, table, r, world)
        for r in range(world):
            torch.testing.assert_close(table[r], total, rtol=0, atol=1e-6)


def test_resident_bucket_reduce_scatter_sums_only_this_ranks_slice_into_its_own_row():
    # stage 1: rank r's slice of the plan gets the sum in row r; everything else keeps what each rank wrote
    world, numel = 2, 32
    chunks = [(0, 16), (16, 32)]
    table, buckets = _resident(world, chunks, numel)
    before, total = table.clone(), table.sum(dim=0)
    for r, b in enumerate(buckets):
        sum_rows(b, table, r, world)
    for r, (lo, hi) in enumerate(chunks):
        torch.testing.assert_close(table[r, lo:hi], total[lo:hi], rtol=0, atol=1e-6)
        outside = torch.ones(numel, dtype=torch.bool)
        outside[lo:hi] = False
        assert torch.equal(table[r][outside], before[r][outside])


def test_resident_bucket_adds_nothing_for_missing_gradients_and_keeps_its_padding():
    # what a parameter accumulated in earlier micro-steps is sent even if no gradient came in this backward
    table, (b, _) = _resident(2)
    before = table[0].clone()
    b.zero_missing(table[0], set())
    b.seal(table[0])
    b.scatter_into(table[0], 0, None, None)
    assert torch.equal(table[0], before)
