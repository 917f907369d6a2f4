"""The transports' all-gather (dsfast/zero/transport/transports.py), in one process: the /dev/shm table's strided
copy against a per-rank loop, one rank's copy, the c10d form's result and hang-watch tag on a 1-rank gloo group, and
the refusal of a buffer that is not in the table. Two real ranks run it through stages 1-3 in
tests/distributed/test_zero_dp.py, test_zero3_dp.py and test_zero3_shm.py."""
import pytest
import torch
import torch.distributed as dist

from dsfast.comm import where
from dsfast.zero.policy.placement import Placement
from dsfast.zero.transport.transports import C10dComm, LocalComm, ShmComm, copy_others, gather_comm
from dsfast.zero.units.flat_shards import FlatShards


@pytest.mark.parametrize("world", [2, 3, 4])
def test_copy_others_fills_this_ranks_row_with_every_ranks_chunk(world):
    chunk = 3
    for rank in range(world):
        rows = torch.randn(world, world * chunk)
        before = rows.clone()
        copy_others(rows, rank)
        expected = before.clone()
        for q in range(world):   # the reference: rank q's chunk out of row q, one slice at a time
            expected[rank, q * chunk:(q + 1) * chunk] = before[q, q * chunk:(q + 1) * chunk]
        assert torch.equal(rows, expected)


def test_local_all_gather_copies_the_shard_unless_it_is_the_buffer():
    comm = LocalComm(1, 0, None)
    out, shard = torch.zeros(4), torch.arange(4.0)
    assert comm.all_gather_async(out, shard, ("gather",)) is None
    assert torch.equal(out, shard)
    comm.all_gather([(out, out)], ("updated shards",))   # in place: nothing to do, nothing changes
    assert torch.equal(out, torch.arange(4.0))


def test_shm_all_gather_refuses_a_buffer_outside_this_ranks_row():
    table = torch.zeros(2, 8)
    comm = ShmComm([], 2, 0, None, table=table)   # (no process group: the check comes before the barrier)
    for wrong in (torch.zeros(4), table[1, :4], table[0, :4].double()):
        with pytest.raises(ValueError, match="rank 0: the buffer .* is not a range of this rank's row"):
            comm.all_gather([(wrong, wrong[:2])], ("updated shards",))


def test_gather_comm_is_one_transport_per_group_made_without_a_process_group():
    two = gather_comm(2, 1)
    assert isinstance(two, C10dComm) and gather_comm(2, 1) is two   # stage 3's records coalesce by it
    assert isinstance(gather_comm(1, 0), LocalComm) and gather_comm(2, 0) is not two


def test_c10d_all_gather_fills_and_tags_its_work(tmp_path, monkeypatch):
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        monkeypatch.setattr(where.WHERE, "works", {})
        comm = C10dComm(1, 0, None)
        out, shard = torch.zeros(6), torch.arange(6.0)
        comm.all_gather([(out, shard)], ("updated shards",), group=dist.group.WORLD)
        assert torch.equal(out, shard)
        assert [w[1] for w in where.WHERE.works.values()] == [("updated shards",)]
        handle = comm.all_gather_async(out[:3], shard[3:], ("gather", "a record"))
        handle.wait()
        assert torch.equal(out[:3], shard[3:])
        assert where.WHERE.works[where.WHERE.issued - 1][1] == ("gather", "a record")
    finally:
        dist.destroy_process_group()


class _Recorder:
    """A transport that only notes what it was asked to all-gather."""
    def __init__(self):
        self.calls = []

    def all_gather(self, pairs, what, group=None):
        self.calls.append((pairs, what, group))


def test_flat_shards_gathers_the_buckets_and_group_asked_for():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n)) for n in (10, 30, 7)]
    store = FlatShards(params, [0, 0, 0], torch.float32, 16, 2, 1, Placement(torch.device("cpu")))
    assert len(store.flats) >= 3 and isinstance(store.comm, C10dComm)   # (no table: c10d)
    store.comm = _Recorder()
    store.all_gather(group="a worker's group", buckets=[1])   # one unit, as a worker thread gathers it
    store.all_gather()
    (one, what, group), (every, _, default) = store.comm.calls
    assert what == ("updated shards",) and group == "a worker's group" and default is None
    assert [i for i, f in enumerate(store.flats) for out, _ in one if out is f] == [1]
    assert [out for out, _ in every] == store.flats
    for plan, (out, shard) in zip(store.plans, every):   # rank 1's slice of each bucket, a view of it
        assert shard.data_ptr() == out[plan.shard:].data_ptr() and shard.numel() == plan.shard
