"""A blocking deepspeed.comm collective is issued async and waited on its recorded work handle, so the hang watch
can name it on NCCL too (there a blocking call returns once queued and the host hangs later, elsewhere): while the
wait runs, where.pending() names the call; async calls return the handle unchanged; the arguments reach torch as
given, async_op aside."""
import pytest
import torch
import torch.distributed

from dsfast.comm import collectives, where


class FakeWork:
    def __init__(self, seen):
        self.seen, self.waited = seen, False

    def wait(self):
        self.seen.append(("pending while waiting", where.pending()))
        self.waited = True
        return True

    def is_completed(self):
        return self.waited


@pytest.fixture
def fake_dist(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)

    def all_reduce(tensor, op=None, group=None, async_op=False):
        seen.append(("all_reduce", async_op))
        return FakeWork(seen) if async_op else None

    def broadcast(tensor, src, group=None, async_op=False):
        seen.append(("broadcast", src, async_op))
        return FakeWork(seen) if async_op else None
    monkeypatch.setattr(collectives.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(collectives.dist, "broadcast", broadcast)
    monkeypatch.setattr(where.WHERE, "works", {})
    monkeypatch.setattr(where.WHERE, "issued", 0)
    return seen


def test_blocking_call_waits_on_its_recorded_handle(fake_dist):
    t = torch.ones(2)
    assert collectives.all_reduce(t) is None
    assert fake_dist[0] == ("all_reduce", True)
    label, pend = fake_dist[1]
    assert pend is not None and pend[1] == ("deepspeed.comm", "all_reduce")
    assert where.pending() is None   # finished once the wait returned


def test_positional_async_op_false_is_also_issued_async(fake_dist):
    collectives.broadcast(torch.ones(2), 0, None, False)
    assert fake_dist[0] == ("broadcast", 0, True)
    assert fake_dist[1][1][1] == ("deepspeed.comm", "broadcast")


def test_async_call_returns_the_handle_recorded(fake_dist):
    work = collectives.all_reduce(torch.ones(2), async_op=True)
    assert isinstance(work, FakeWork) and not work.waited
    assert where.pending()[1] == ("deepspeed.comm", "all_reduce")
    work.wait()
