"""Stage 3's prefetcher (dsfast/zero/params/prefetch.py) without processes: how far ahead of the running module it
launches
all-gathers under DeepSpeed's stage3_prefetch_bucket_size and stage3_max_live_parameters, and what it frees."""
import pytest
import torch

from dsfast.zero.params import prefetch
from dsfast.zero.params.partitioned_param import PartitionedParam, ShardedState


def Rec(name, numel):
    """A real parameter record (rank 0 of 2): the prefetcher's moves go through its state checks."""
    rec = PartitionedParam(torch.nn.Parameter(torch.zeros(numel)), world=2, rank=0)
    rec.name = name
    return rec


class FakeFlight:
    """Launches nothing: notes what would be gathered, in order."""
    launched = []

    def __init__(self, recs):
        self.recs, self.handle = recs, object()
        FakeFlight.launched.append([r.name for r in recs])
        for r in recs:
            r._alloc_full()
            r.prefetched(self)

    def finish(self):
        if self.handle is None:
            return
        self.handle = None
        for r in self.recs:
            r.prefetched(None)


@pytest.fixture
def modules(monkeypatch):
    monkeypatch.setattr(prefetch, "Flight", FakeFlight)
    FakeFlight.launched = []
    return {m: [Rec(m, n)] for m, n in (("a", 10), ("b", 10), ("c", 10), ("d", 10))}


def forward(pf, modules, order, launched_at):
    """One forward: each module gathers (using its flight if there is one), tells the prefetcher, is released."""
    pf.begin_pass()
    for m in order:
        before = len(FakeFlight.launched)
        for r in modules[m]:
            if r.flight is not None:
                r.flight.finish()
            if not r.ready:
                r._alloc_full()
            r._publish()
        pf.visit(m)
        launched_at[m] = FakeFlight.launched[before:]
        for r in modules[m]:
            r.release(resize=True)
    pf.end_pass()


def run(modules, **kw):
    pf = prefetch.Prefetcher(lambda m: modules[m], True, **kw)
    first, second = {}, {}
    forward(pf, modules, "abcd", first)      # no trace yet: nothing prefetched
    forward(pf, modules, "abcd", second)
    assert all(v == [] for v in first.values())
    return second


def test_a_small_bucket_keeps_one_module_ahead(modules):
    assert run(modules, bucket=1) == {"a": [["b"]], "b": [["c"]], "c": [["d"]], "d": []}


def test_a_large_bucket_launches_every_coming_module_at_once(modules):
    assert run(modules, bucket=10 ** 9) == {"a": [["b"], ["c"], ["d"]], "b": [], "c": [], "d": []}


def test_the_bucket_counts_elements_in_flight(modules):
    # 15 elements: b (10) is launched, then 10 < 15 so c too; 20 >= 15 stops; at b, c is still in flight (10)
    assert run(modules, bucket=15) == {"a": [["b"], ["c"]], "b": [["d"]], "c": [], "d": []}


def test_prefetch_bucket_zero_turns_prefetching_off(modules):
    assert run(modules, bucket=0) == {"a": [], "b": [], "c": [], "d": []}


def test_max_live_parameters_holds_launches_back(modules):
    # running 10 + in flight: b (20 <= 25) yes, c (30 > 25) waits until b runs
    assert run(modules, bucket=10 ** 9, max_live=25) == {"a": [["b"]], "b": [["c"]], "c": [["d"]], "d": []}


def test_a_forward_that_leaves_the_trace_stops_and_frees_what_it_prefetched(modules):
    pf = prefetch.Prefetcher(lambda m: modules[m], True, bucket=10 ** 9)
    forward(pf, modules, "abcd", {})
    seen = {}
    forward(pf, modules, "ac", seen)                   # diverges at c: b, c, d were in flight
    assert seen == {"a": [["b"], ["c"], ["d"]], "c": []}
    for m in "bd":                                      # never used: waited for, not kept whole
        r = modules[m][0]
        assert r.state is ShardedState.SHARDED and r.flight is None and r.full.untyped_storage().nbytes() == 0


def test_every_state_change_of_a_parameter_is_checked():
    r = Rec("a", 10)
    assert r.state is ShardedState.SHARDED and r.param.ds_status.name == "NOT_AVAILABLE"
    with pytest.raises(RuntimeError, match="sharded -> sharded is not a valid transition"):
        r.free()                                        # freeing what is not gathered
    r._alloc_full()
    r.prefetched(object())
    assert r.state is ShardedState.GATHERING and r.param.ds_status.name == "INFLIGHT"
    with pytest.raises(RuntimeError, match="gathering -> unsharded"):
        r._publish()                                    # using values whose all-gather has not landed
    r.prefetched(None)
    assert r.ready and r.param.ds_status.name == "INFLIGHT"
    r._publish()
    assert r.gathered and r.param.ds_status.name == "AVAILABLE" and r.param.shape == (10,)
    with pytest.raises(RuntimeError, match="unsharded -> gathering"):
        r.prefetched(object())                          # prefetching what is already whole
    r.release()
    assert r.state is ShardedState.SHARDED and r.param.numel() == 0
