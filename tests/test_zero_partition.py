"""ZeRO partition maths, without processes: bucket plans, each rank's slices, padding, alignment, formulas."""
import pytest

from dsfast.zero.policy.partition import ALIGN, BucketPlan, owned_pieces, plan_buckets, round_up
from dsfast.zero import model_state_bytes


def test_buckets_follow_reverse_order_and_cut_at_the_size():
    plans = plan_buckets([10, 20, 30, 40], [0, 0, 0, 0], ["f"] * 4, bucket_elems=70, world=2)
    assert [[e.param for e in p.entries] for p in plans] == [[3, 2], [1, 0]]
    assert [p.numel for p in plans] == [70, 30]
    assert all(p.padded % (2 * ALIGN) == 0 and p.padded >= p.numel for p in plans)


def test_buckets_never_mix_param_groups_or_kinds():
    plans = plan_buckets([5, 5, 5, 5], [0, 0, 1, 1], ["a", "b", "b", "b"], bucket_elems=100, world=4)
    assert [(p.group, [e.param for e in p.entries]) for p in plans] == [(1, [3, 2]), (0, [1]), (0, [0])]


def test_a_parameter_larger_than_the_bucket_gets_its_own():
    plans = plan_buckets([3, 1000, 3], [0, 0, 0], ["f"] * 3, bucket_elems=100, world=3)
    assert [[e.param for e in p.entries] for p in plans] == [[2], [1], [0]]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("sizes", [[1], [7, 8, 17], [4097, 1, 3], [1_000_003]])
def test_every_element_is_owned_by_exactly_one_rank(world, sizes):
    plans = plan_buckets(sizes, [0] * len(sizes), ["f"] * len(sizes), bucket_elems=5000, world=world)
    for plan in plans:
        assert plan.shard % ALIGN == 0 and plan.shard * world == plan.padded
        seen = {e.param: [0] * e.numel for e in plan.entries}
        for rank in range(world):
            lo, hi = plan.shard_range(rank)
            for e, a, b, off in owned_pieces(plan, rank):
                assert 0 <= a < b <= e.numel and 0 <= off and off + (b - a) <= plan.shard
                assert lo + off == e.offset + a          # the piece sits where the flat bucket has it
                for k in range(a, b):
                    seen[e.param][k] += 1
        assert all(c == 1 for counts in seen.values() for c in counts)


def test_shard_ranges_and_padding():
    plan = BucketPlan(0, 0, (), numel=100, padded=round_up(100, 4 * ALIGN), world=4)
    assert plan.padded == 128 and plan.shard == 32
    assert [plan.shard_range(r) for r in range(4)] == [(0, 32), (32, 64), (64, 96), (96, 128)]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="world must be >= 1"):
        plan_buckets([1], [0], ["f"], 10, 0)
    with pytest.raises(ValueError, match="one entry per parameter"):
        plan_buckets([1, 2], [0], ["f"], 10, 1)


@pytest.mark.parametrize("stage,mixed,offload,device,host", [
    (1, True, False, 4 * 1000 + 12 * 1000 / 4, 0), (2, True, False, 2 * 1000 + 14 * 1000 / 4, 0),
    (2, True, True, 2 * 1000 + 2 * 1000 / 4, 12 * 1000 / 4), (1, False, False, 8 * 1000 + 8 * 1000 / 4, 0),
    (2, False, False, 4 * 1000 + 12 * 1000 / 4, 0), (3, True, False, 16 * 1000 / 4, 0)])
def test_model_state_formulas(stage, mixed, offload, device, host):
    assert model_state_bytes(1000, 4, stage, mixed, offload) == {"device": device, "host": host}
