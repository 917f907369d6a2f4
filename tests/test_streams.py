"""The lanes of dsfast.accelerator.streams: order, events that really wait, failures raised where waited on,
and the chaos mode's delays (reproducible per seed; bad values named)."""
import threading
import time

import pytest
import torch

from dsfast.accelerator import streams
from dsfast.accelerator.streams import InlineLane, LaneError, Lanes, ThreadLane, chaos_from_env


def test_thread_lane_runs_in_order_and_event_waits():
    lane = ThreadLane("t", chaos=(1, 0.002))
    seen = []
    events = [lane.submit(lambda i=i: seen.append(i), f"item {i}") for i in range(50)]
    events[-1].wait()
    assert seen == list(range(50))
    assert all(e.query() for e in events)
    lane.close()


def test_thread_lane_work_happens_later_than_submission():
    lane = ThreadLane("late")
    gate = threading.Event()
    t = torch.zeros(4)
    lane.submit(gate.wait)
    ev = lane.submit(lambda: t.add_(1), "add")
    assert not ev.query() and t.sum() == 0   # not run yet: the gate holds the lane
    gate.set()
    ev.wait()
    assert t.sum() == 4
    lane.close()


def test_failure_is_raised_at_the_wait_naming_the_item_and_later_items_are_not_run():
    lane = ThreadLane("f")
    ran = []

    def boom():
        raise OSError("disk gone")
    e1 = lane.submit(boom, "unit 3 of step 7")
    e2 = lane.submit(lambda: ran.append(1), "unit 4 of step 7")
    with pytest.raises(LaneError, match="unit 3 of step 7: OSError: disk gone"):
        e1.wait()
    with pytest.raises(LaneError, match="OSError: disk gone"):
        e2.wait()
    assert ran == []
    with pytest.raises(LaneError):
        lane.drain()
    lane.close()


def test_closed_lane_refuses_work():
    lane = ThreadLane("c")
    lane.close()
    lane.close()   # idempotent
    with pytest.raises(RuntimeError, match="lane 'c' is closed"):
        lane.submit(lambda: None)


def test_inline_lane_runs_at_once():
    t = torch.zeros(2)
    ev = InlineLane().submit(lambda: t.add_(2))
    assert ev.query() and t.sum() == 4


def test_lanes_pick_the_kind(monkeypatch):
    monkeypatch.delenv(streams.CHAOS_ENV, raising=False)
    plain = Lanes("cpu", emulate=False)
    assert isinstance(plain.device_lane("d2h"), InlineLane)
    assert isinstance(plain.host_lane("step"), ThreadLane)
    assert plain.host_lane("step") is plain.host_lane("step")
    plain.close()
    test = Lanes("cpu", emulate=True)
    assert isinstance(test.device_lane("d2h"), ThreadLane)
    test.close()


def test_chaos_delays_are_reproducible_and_bounded(monkeypatch):
    monkeypatch.setenv(streams.CHAOS_ENV, "5")
    monkeypatch.setenv(streams.CHAOS_MS_ENV, "4")
    assert chaos_from_env() == (5, 0.004)
    a, b = ThreadLane("x", chaos_from_env()), ThreadLane("x", chaos_from_env())
    da = [a._rng.uniform(0, a._max_delay) for _ in range(20)]
    db = [b._rng.uniform(0, b._max_delay) for _ in range(20)]
    assert da == db and max(da) <= 0.004 and len(set(da)) == 20
    c = ThreadLane("y", chaos_from_env())   # another lane: other delays
    assert [c._rng.uniform(0, c._max_delay) for _ in range(20)] != da
    for lane in (a, b, c):
        lane.close()
    start = time.perf_counter()
    lane = ThreadLane("z", (1, 0.01))
    for _ in range(10):
        lane.submit(lambda: None)
    lane.drain()
    assert time.perf_counter() - start > 0.005   # the delays are really slept (10 items, mean 5 ms each)
    lane.close()


@pytest.mark.parametrize("env,value,match", [(streams.CHAOS_ENV, "yes", "valid values are an integer seed"),
                                             (streams.CHAOS_MS_ENV, "-1", "milliseconds >= 0"),
                                             (streams.CHAOS_MS_ENV, "lots", "milliseconds >= 0")])
def test_bad_chaos_settings_are_named(monkeypatch, env, value, match):
    monkeypatch.setenv(streams.CHAOS_ENV, "1")
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=match) as e:
        chaos_from_env()
    assert env in str(e.value)
