"""The hang watch on 2 gloo ranks (dsfast/comm/hang_watch.py): every rank stops within seconds with a message saying
which rank is where, instead of waiting for the process group's timeout; no alarm when a rank is merely slow.

One launch per case (a hang ends its processes), three at a time: each spends much of its time waiting for
the threshold, so they overlap. The threshold is 1.5 s, far below the process group's timeout (the launch's 90 s):
a message comes from the watch.

Every case runs twice: as gloo is (a wait blocks the host inside a tagged collective), and in NCCL's shape
(DSFAST_HANG_WATCH_NCCL_SHAPE=1: waits are untagged, as on NCCL where they return at once, so the watch knows where
a rank waits only from the work handles dsfast recorded, where.issued); the messages must be the same.
"""
import concurrent.futures
import os

import pytest

from dist_launch import launch

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "worker_hang.py")
CASES = ("uneven", "skip", "save", "eval", "killed", "calm")
HANG = 87   # dsfast.comm.hang_watch.HANG_EXIT_CODE
# same-host CPU ranks reduce (and stage 3 gathers) through shared memory by default; the other cases turn that off
# so that stage 3's gathers are gloo collectives
SHARED_MEMORY = {"uneven"}


@pytest.fixture(scope="module", params=["blocking", "nccl_shape"])
def runs(request, tmp_path_factory):
    # the folders are made here, in one thread: pytest makes its base folder on first use, and three threads doing
    # that at once in a worker that had not used it yet collided (FileExistsError at setup)
    outs = {case: tmp_path_factory.mktemp(f"hang_{case}_{request.param}") for case in CASES}

    def one(case):
        out = outs[case]
        env = {"DSFAST_HANG_WATCH_S": "1.5", "DSFAST_SHM_ALLREDUCE": "1" if case in SHARED_MEMORY else "0",
               "SLOW_S": "4", "DSFAST_HANG_WATCH_NCCL_SHAPE": "1" if request.param == "nccl_shape" else "0"}
        results = launch(WORKER, [case, out], nprocs=2, timeout=90, check=False, extra_env=env)
        return case, (results, out)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        return dict(pool.map(one, CASES))


def _hang_message(results):
    """The verdict every rank printed (the same on each), after checking both ranks ended with HANG."""
    lines = []
    for rank, (rc, out) in enumerate(results):
        assert rc == HANG, f"rank {rank} exit {rc}:\n{out[-3000:]}"
        lines.append(next(line for line in out.splitlines() if "HangError:" in line))
    assert lines[0].split("HangError:")[1] == lines[1].split("HangError:")[1]
    return lines[0]


def test_uneven_data_names_the_extra_forward(runs):
    msg = _hang_message(runs["uneven"][0])
    # shared memory: stage 3's gathers are no collectives, so rank 0 waits in its extra backward's reduction
    assert "rank 0 is reducing gradient bucket 0 (layers.2.bias, layers.2.weight, ... (6 in all)) in backward " \
           "(global_steps 2, micro_steps 2)" in msg
    assert "rank 1 is at the end of its program" in msg
    assert "different numbers of forward passes (rank 0: 3, rank 1: 2)" in msg


def test_skipped_module_shows_the_diverging_collectives(runs):
    msg = _hang_message(runs["skip"][0])
    # rank 1 skips layers.1 from its second forward on: rank 0 gathers it for backward while rank 1 already
    # reduces (gloo pairs same-sized gathers of different layers silently, so which step it stops in may vary)
    assert "rank 0 is gathering `layers.1` (weight, bias) in backward (global_steps" in msg
    assert "rank 1 is reducing gradient bucket 0 (layers.2.bias, layers.2.weight, ... (6 in all)) in backward" in msg
    assert "the ranks issued different collectives: `layers.1` is gathered on rank 0 only" in msg


def test_checkpoint_on_one_rank(runs):
    msg = _hang_message(runs["save"][0])
    assert "rank 0 is reducing gradient bucket" in msg and "in backward (global_steps 1, micro_steps 1)" in msg
    assert "rank 1 is at save_checkpoint's rendezvous 'begin' in save_checkpoint (global_steps 1)" in msg
    assert "save_checkpoint / load_checkpoint must be called on every rank" in msg


def test_eval_forward_on_one_rank(runs):
    msg = _hang_message(runs["eval"][0])
    assert "different numbers of forwards in eval mode (rank 0: 0, rank 1: 1)" in msg


def test_killed_rank_is_named_dead(runs):
    (rc0, out0), (rc1, _) = runs["killed"][0]
    assert rc1 == -9
    assert rc0 != 0
    line = next(line for line in out0.splitlines() if "a collective failed; where the ranks are:" in line)
    assert "rank 1 is dead (no heartbeat for" in line
    assert "rank 0 is" in line and "in backward (global_steps 1, micro_steps 1)" in line


def test_slow_rank_is_no_hang_and_different_tags_are_an_error(runs):
    results, out = runs["calm"]
    for rank, (rc, text) in enumerate(results):
        assert rc == 0 and "HangError" not in text, f"rank {rank} exit {rc}:\n{text[-3000:]}"
        got = (out / f"rank{rank}.txt").read_text()
        assert got.startswith("CheckpointError:") and "rank 0 'tag0', rank 1 'tag1'" in got
