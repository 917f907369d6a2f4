"""The hang watch's decisions and words in one process (dsfast/comm/hang_report.py, hang_watch.resolve_after_s,
where.py); the distributed cases are tests/distributed/test_hang_watch.py."""
import json

import pytest
import torch

from dsfast.comm import hang_report, where
from dsfast.comm.hang_watch import DEFAULT_AFTER_S, resolve_after_s
from dsfast.config import load_config


def _e(beat, seq, inside, what="gathering `a`", site="forward", forwards=1, evals=0, gone=False, step=0, micro=0):
    return {"beat": beat, "seq": seq, "inside": inside, "what": what, "site": site, "step": step, "micro": micro,
            "forwards": forwards, "backwards": 0, "evals": evals, "training": True, "gone": gone}


def test_slow_rank_outside_any_collective_is_no_hang():
    # rank 0 waits in collective 5; rank 1 is still computing (not inside, heartbeat moving): merely slower
    before = {0: _e(1, 5, True), 1: _e(1, 4, False)}
    after = {0: _e(2, 5, True), 1: _e(2, 4, False)}
    assert hang_report.verdict(before, after, 2, 3) is None


def test_rank_whose_collective_count_moves_is_no_hang():
    before = {0: _e(1, 5, True), 1: _e(1, 3, True, what="reducing gradient bucket 0")}
    after = {0: _e(2, 5, True), 1: _e(2, 4, True, what="reducing gradient bucket 1")}
    assert hang_report.verdict(before, after, 2, 3) is None


def test_ranks_waiting_in_the_same_collective_are_slow_together_not_hung():
    before = {r: _e(1, 5, True) for r in range(3)}
    after = {r: _e(2, 5, True) for r in range(3)}
    assert hang_report.verdict(before, after, 3, 3) is None


def test_different_collectives_are_a_hang_naming_each_rank():
    before = {0: _e(1, 7, True, forwards=5, micro=4, step=3), 1: _e(1, 6, True, what="at save_checkpoint's "
              "rendezvous 'begin'", site="save_checkpoint", forwards=4, step=3),
              2: _e(1, 7, True, forwards=5, micro=4, step=3)}
    after = {r: dict(e, beat=2) for r, e in before.items()}
    msg = hang_report.verdict(before, after, 3, 3)
    assert msg == ("ranks 0, 2 are gathering `a` in forward (global_steps 3, micro_steps 4); rank 1 is at "
                   "save_checkpoint's rendezvous 'begin' in save_checkpoint (global_steps 3): save_checkpoint / "
                   "load_checkpoint must be called on every rank at the same point")


def test_forward_counts_and_eval_forwards_explain_the_hang():
    before = {0: _e(1, 7, True, forwards=5), 1: _e(1, 6, True, what="at the end of its program", site="exit",
                                                    forwards=4)}
    after = {r: dict(e, beat=2) for r, e in before.items()}
    assert hang_report.verdict(before, after, 2, 3).endswith(
        "the ranks ran different numbers of forward passes (rank 0: 5, rank 1: 4)")
    before[1].update(evals=1, forwards=5, site="backward")
    after = {r: dict(e, beat=2) for r, e in before.items()}
    assert "different numbers of forwards in eval mode (rank 0: 0, rank 1: 1)" in \
        hang_report.verdict(before, after, 2, 3)


def test_a_module_gathered_on_some_ranks_only_is_named():
    before = {0: _e(1, 7, True, what="gathering `layers.1` (weight)"), 1: _e(1, 7, True, what="reducing bucket 0"),
              2: _e(1, 7, True, what="gathering `layers.1` (weight)")}
    after = {r: dict(e, beat=2) for r, e in before.items()}
    assert hang_report.verdict(before, after, 3, 3).endswith(
        "the ranks issued different collectives: `layers.1` is gathered on ranks 0, 2 only (a module that ran on "
        "some ranks only: a data-dependent branch under ZeRO stage 3?)")
    before[1]["what"] = after[1]["what"] = "in the step decision's all-reduce"
    before[0]["what"] = after[0]["what"] = before[2]["what"] = after[2]["what"] = "reducing bucket 0"
    assert hang_report.verdict(before, after, 3, 3).endswith("or a collective called on some ranks only")


def test_dead_and_ended_ranks_are_named():
    before = {0: _e(1, 7, True), 1: _e(4, 6, False, site="backward", step=2, micro=2), 2: _e(1, 7, True)}
    after = {0: _e(2, 7, True), 1: _e(4, 6, False, site="backward", step=2, micro=2), 2: _e(2, 7, True)}
    msg = hang_report.verdict(before, after, 3, 3)
    assert "rank 1 is dead (no heartbeat for 3 s; it was last computing in backward (global_steps 2, " \
           "micro_steps 2) (in no collective))" in msg and msg.endswith(": rank 1 died")
    # a rank whose program ended left the watch: named as such, not as dead
    after[1] = dict(after[1], gone=True)
    msg = hang_report.verdict(before, after, 3, 3)
    assert "rank 1 has ended its program" in msg and "dead" not in msg


def test_rank_not_yet_publishing_is_left_out():
    before, after = {0: _e(1, 3, True)}, {0: _e(2, 3, True)}
    assert hang_report.verdict(before, after, 2, 3) is None


def test_tags_in_words():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    names = hang_report.param_names(model)
    recs = [type("Rec", (), {"param": p})() for p in model[1][0].parameters()]
    assert hang_report.describe_what(("gather", recs), names) == "gathering `1.0` (weight, bias)"
    assert hang_report.describe_what(("gather", [type("Rec", (), {"param": p})() for p in model.parameters()]),
                                     names) == "gathering `(the root module)` (0.weight, 0.bias, 1.0.weight, 1.0.bias)"
    bucket = type("B", (), {"index": 2, "members": [(0, recs[0])]})()
    assert hang_report.describe_what(("reduce", bucket), names) == "reducing gradient bucket 2 (1.0.weight)"
    assert hang_report.describe_what(("checkpoint", "save_checkpoint", "commit"), names) == \
        "at save_checkpoint's rendezvous 'commit'"
    assert hang_report.describe_what(("deepspeed.comm", "all_reduce"), names) == "in deepspeed.comm.all_reduce"
    assert hang_report.describe_what(("gather check",), names).startswith("in stage 3's check, at the end of backward")


def test_where_counts_and_tags_without_building_text():
    w, saved = where.WHERE, {k: getattr(where.WHERE, k) for k in where.Where.__slots__}
    try:
        seq = w.seq
        tag = ("gather", [])
        where.at(tag)
        assert (w.seq, w.inside, w.what is tag) == (seq + 1, True, True)    # the tuple itself: no text made
        where.done()
        assert not w.inside
        where.forward(3, 7, training=False)
        entry = json.loads(hang_report.entry(w, 9, {}))
        assert entry["site"] == "forward" and entry["step"] == 3 and entry["micro"] == 7 and entry["evals"] >= 1
    finally:
        for k, v in saved.items():
            setattr(w, k, v)


def _cfg(section=None):
    base = {"train_batch_size": 1}
    if section is not None:
        base["hang_watch"] = section
    return load_config(config=base)


def test_threshold_sources_and_bounds():
    assert resolve_after_s(_cfg(), 600, env={}) == DEFAULT_AFTER_S
    assert resolve_after_s(_cfg({"after_s": 12}), 600, env={}) == 12
    assert resolve_after_s(_cfg({"after_s": 12}), 600, env={"DSFAST_HANG_WATCH_S": "4"}) == 4
    assert resolve_after_s(_cfg({"enabled": False}), 600, env={}) == 0
    assert resolve_after_s(_cfg(), 600, env={"DSFAST_HANG_WATCH_S": "0"}) == 0
    assert resolve_after_s(_cfg(), 20, env={}) == 10          # the default stays below a short group timeout


@pytest.mark.parametrize("env,cfg,match", [
    ({"DSFAST_HANG_WATCH_S": "soon"}, None, r"DSFAST_HANG_WATCH_S='soon': give the seconds \(>= 0\)"),
    ({"DSFAST_HANG_WATCH_S": "-1"}, None, r"DSFAST_HANG_WATCH_S='-1'"),
    ({"DSFAST_HANG_WATCH_S": "700"}, None, r"DSFAST_HANG_WATCH_S=700 s is not below the process group's timeout"),
    ({}, {"after_s": 900}, r"hang_watch.after_s=900 s is not below the process group's timeout \(600 s\)"),
])
def test_bad_thresholds_are_errors_naming_the_source(env, cfg, match):
    with pytest.raises(ValueError, match=match):
        resolve_after_s(_cfg(cfg), 600, env=env)


def test_config_refuses_a_non_positive_after_s():
    with pytest.raises(Exception, match="hang_watch.after_s"):
        _cfg({"after_s": 0})


def test_a_collective_failing_while_the_watch_ends_the_process_exits_with_the_verdict_s_code(monkeypatch):
    """A rank that read the verdict first ends and fails this rank's collective before this rank's watch has ended
    it: the main thread's error must not turn the verdict's exit code (87) into an ordinary failure (1)."""
    import types

    from dsfast.comm import hang_watch
    watch = types.SimpleNamespace(finishing=True, poll=0.0, halt=None)
    monkeypatch.setattr(hang_watch, "_watch", [watch])
    monkeypatch.setattr(hang_watch.time, "sleep", lambda s: None)

    def exits(code):
        raise SystemExit(code)
    monkeypatch.setattr(hang_watch.os, "_exit", exits)
    with pytest.raises(SystemExit) as ended:
        hang_watch._excepthook(RuntimeError, RuntimeError("Connection closed by peer"), None)
    assert ended.value.code == hang_watch.HANG_EXIT_CODE == 87


class _Work:
    """A work handle as torch.distributed returns it: is_completed(), and a future that re-raises a failure."""

    def __init__(self, finished=False, error=None):
        self.finished, self.error = finished, error

    def is_completed(self):
        return self.finished

    def wait(self):
        self.finished = True

    def get_future(self):
        work = self

        class Future:
            def value(self):
                if work.error is not None:
                    raise work.error
        return Future()


@pytest.fixture
def recording(monkeypatch):
    """WHERE as the running watch leaves it (recording works), restored after."""
    w = where.WHERE
    saved = {k: getattr(w, k) for k in where.Where.__slots__}
    w.works, w.issued, w.inside = {}, 0, False
    monkeypatch.setattr(where, "HOST_WAITS", True)
    yield w
    for k, v in saved.items():
        setattr(w, k, v)


def test_the_oldest_unfinished_collective_is_where_a_rank_waits(recording):
    w = recording
    a, b, c = _Work(), _Work(), _Work()
    tag_a, tag_b, tag_c = ("gather", []), ("reduce", None), ("decision",)
    assert where.issued(a, tag_a) is a            # the handle comes back unchanged
    seq_a = w.seq
    where.issued(b, tag_b)
    where.issued(c, tag_c)
    assert w.works[0][1] is tag_a                 # the tag itself is kept: no text made
    assert where.position() == (seq_a, tag_a)     # nothing finished: the oldest
    a.finished = True
    assert where.position() == (seq_a + 1, tag_b)
    assert 0 not in w.works                       # a finished one is let go (its buffers with it)
    b.finished = c.finished = True
    assert where.position() is None               # all finished and no blocking wait: computing
    assert list(w.works) == [2]                   # the newest stays, for a failure to be named by
    where.at(("checkpoint", "save_checkpoint", "begin"))
    assert where.position() == (w.seq, ("checkpoint", "save_checkpoint", "begin"))   # a blocking wait
    where.done()


def test_an_unfinished_collective_comes_before_a_blocking_wait(recording):
    # on NCCL a rank's host can reach a blocking wait (the exit's) while a collective it issued is still stuck
    w = recording
    tag = ("gather", [])
    where.issued(_Work(), tag)
    seq = w.seq
    where.at(("exit",))
    assert where.position() == (seq, tag) and where.position()[1] is tag
    where.done()


def test_only_the_newest_ring_of_handles_is_held(recording):
    w = recording
    works = [_Work() for _ in range(where.RING + 5)]
    for i, work in enumerate(works):
        where.issued(work, ("reduce", i))
    assert len(w.works) == where.RING and min(w.works) == 5
    assert where.position()[1] == ("reduce", 5)   # a hang deeper than RING is named by the oldest kept


def test_nothing_is_kept_without_a_watch(recording):
    w = recording
    w.works = None
    seq = w.seq
    where.issued(_Work(), ("decision",))
    assert w.seq == seq + 1 and w.issued == 0 and where.position() is None


def test_a_failed_collective_is_named_after_the_error(recording):
    w = recording
    first, second = _Work(finished=True), _Work(finished=True, error=RuntimeError("Connection closed by peer"))
    where.issued(first, ("gather", []))
    where.issued(second, ("reduce", None))
    assert where.position() is None                             # the watch's poll: both finished
    assert where.position(failed=True) == (w.seq, ("reduce", None))   # the excepthook: the one that raised
    where.issued(_Work(finished=True), ("decision",))
    where.position()                                            # the failed one dropped by a poll ...
    assert where.position(failed=True) is None                  # ... and the newest ended well: no collective failed


def test_waits_are_tagged_only_where_they_block_the_host(recording, monkeypatch):
    w = recording
    work = _Work()
    where.wait_now(work, ("nvme",))
    assert work.finished and not w.inside and w.what == ("nvme",)
    monkeypatch.setattr(where, "HOST_WAITS", False)              # NCCL's shape: the wait returns at once
    seq = w.seq
    where.at_work(("gather", []))
    assert not w.inside and w.seq == seq


def test_forget_drops_a_handle_whose_wait_returned(recording):
    w = recording
    where.issued(_Work(), ("reduce", None))                     # gloo's reduce-scatter never says is_completed()
    where.forget(w.issued - 1)
    assert where.position() is None


def test_published_entry_says_where_the_rank_waits():
    entry = json.loads(hang_report.entry(where.WHERE, 1, {}, pos=(7, ("decision",))))
    assert (entry["seq"], entry["inside"]) == (7, True) and entry["what"].startswith("in the step decision")
    assert json.loads(hang_report.entry(where.WHERE, 1, {}))["inside"] is False


@pytest.mark.parametrize("value,shape", [("", False), ("0", False), ("1", True)])
def test_nccl_shape_switch(value, shape):
    assert where.nccl_shape({"DSFAST_HANG_WATCH_NCCL_SHAPE": value}) is shape


def test_nccl_shape_switch_refuses_other_values():
    with pytest.raises(ValueError, match=r"DSFAST_HANG_WATCH_NCCL_SHAPE='yes': give 1"):
        where.nccl_shape({"DSFAST_HANG_WATCH_NCCL_SHAPE": "yes"})


def test_an_unfinished_collective_is_no_failure(recording):
    # an exception of the program's own while a prefetched gather is in flight: no collective failed
    where.issued(_Work(), ("gather", []))
    assert where.position(failed=True) is None
    where.at(("decision",))                                      # unless it was raised inside a blocking wait
    assert where.position(failed=True) == (recording.seq, ("decision",))
    where.done()


def test_a_work_without_a_future_is_not_taken_for_a_failed_one(recording):
    class NoFuture(_Work):   # gloo's reduce-scatter: get_future() raises "not implemented"
        def get_future(self):
            raise RuntimeError("Work::getFuture not implemented.")
    where.issued(NoFuture(finished=True), ("reduce", None))
    assert where.position(failed=True) is None
