"""offload_optimizer.overlap_step with the optimizer states on NVMe (device "nvme"), one rank: the worker walks the
units through the states' window (zero/step/overlap.py _walk) and the result is bitwise the serial step's at stages
1-3 (fp32/bf16, clipping, a scheduler, fp16 skips, accumulation), under the test placement and the chaos delays;
each unit's states are read ahead as its gradient lands at the boundary (NvmeStates.read_ahead), serial and
overlapped; an I/O error in the worker is raised at the next backward naming the unit and the step. The 2-rank row
is in tests/distributed/test_overlap_step_dp.py."""
import errno
import re

import pytest
import torch

import dsfast
from _overlap_helpers import assert_same, batch, engine, snapshot, train
from dsfast.zero.nvme import io as nvme_io
from dsfast.zero.step.overlap import OverlapFailure


@pytest.fixture(autouse=True)
def _placement_and_chaos(monkeypatch):
    monkeypatch.setenv("DSFAST_TEST_PLACEMENT", "distinct-host")
    monkeypatch.setenv("DSFAST_STREAM_CHAOS", "5")
    monkeypatch.setenv("DSFAST_STREAM_CHAOS_MS", "10")   # (the walk starts well after step() returns)


def _both(stage, tmp_path, steps=4, gas=1, overflow_at=None, **kw):
    out = []
    for overlap in (False, True):
        eng = engine(stage, overlap=overlap, gas=gas, nvme=tmp_path / f"overlap{overlap}", **kw)
        assert eng.state_owner.store.swap is not None
        losses = train(eng, steps, gas=gas, overflow_at=overflow_at)
        out.append((losses, snapshot(eng)))
        eng.destroy()
    return out


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bitwise_the_serial_nvme_step_with_clipping_and_a_scheduler(stage, precision, tmp_path):
    (l0, s0), (l1, s1) = _both(stage, tmp_path, precision=precision, clip=0.05, scheduler=True)
    assert l0 == l1
    assert_same(s0, s1)


def test_fp16_overflow_skip_and_accumulation_with_nvme(tmp_path):
    (l0, s0), (l1, s1) = _both(3, tmp_path, steps=3, gas=2, overflow_at=1, precision="fp16", clip=1.0)
    assert s1["steps"][2] == 1
    assert l0[2:] == l1[2:]
    assert_same(s0, s1)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_states_are_read_as_their_gradients_land_in_backward(stage, overlap, tmp_path):
    eng = engine(stage, overlap=overlap, gas=2, nvme=tmp_path, buffers=2)   # (fewer buffers than weights' units)
    swap = eng.state_owner.store.swap
    train(eng, 1, gas=2)
    eng.state_owner.settle()
    window = swap.window
    assert [window.state_of(u.index) for u in swap.units] == [None] * len(swap.units)   # the walk left nothing
    x, y = batch(7)
    eng.backward(torch.nn.functional.mse_loss(eng(x), y))   # not the boundary: nothing read
    assert [window.state_of(u.index) for u in swap.units] == [None] * len(swap.units)
    eng.step()
    eng.backward(torch.nn.functional.mse_loss(eng(x), y))   # the boundary: the first units to land are read
    # (plain ints and strings in the asserts: a unit's repr would read its parked, storage-less tensors)
    states = [window.state_of(u.index) for u in swap.units]
    read = [u.index for u, s in zip(swap.units, states) if s is not None]
    n_units = len(swap.units)
    buffered = [i for i in read if not window.is_small(i)]   # (a small unit, a bias, takes none of the buffers)
    assert len(buffered) == window.buffer_count < n_units - sum(window.is_small(u.index) for u in swap.units), states
    assert [window.state_of(i) for i in read] == ["reading"] * len(read)
    # the last layers' gradients land first: theirs are read (the model's order would read the first layers)
    landing_first = [u.index for u in sorted(swap.units, key=lambda u: -min(e.param for e in u.plan.entries))]
    assert sorted(buffered) == sorted([i for i in landing_first if not window.is_small(i)][:len(buffered)])
    assert all(window.state_of(u.index) == "reading" for u in swap.units if window.is_small(u.index))
    walk = [u.index for u in swap.step_order(swap.units)]
    assert walk[:len(read)] == read   # walked first
    eng.step()
    eng.state_owner.settle()
    assert [window.state_of(u.index) for u in swap.units] == [None] * len(swap.units)


@pytest.mark.parametrize("stage", [1, 3])
def test_an_io_error_in_the_worker_is_raised_at_the_next_backward_naming_unit_and_step(stage, tmp_path,
                                                                                      monkeypatch):
    eng = engine(stage, nvme=tmp_path)
    train(eng, 1)
    eng.state_owner.settle()
    real = nvme_io.os.pwritev
    calls = []

    def fails_second(fd, buffers, offset):   # the second write of step 2 finds the disk full
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)
    monkeypatch.setattr(nvme_io.os, "pwritev", fails_second)
    x, y = batch(5)
    eng.backward(torch.nn.functional.mse_loss(eng(x), y))
    eng.step()   # returns: the walk runs in the worker
    loss = torch.nn.functional.mse_loss(eng(x), y)
    with pytest.raises(OverlapFailure, match=r"optimizer step 2 failed on rank 0 at unit (\d+) \(parameters .*"
                                             r"SwapError: NVMe swap write of '.*unit\d+\.swap' at step 2 failed: "
                                             "No space left on device") as failed:
        eng.backward(loss)
    unit, file = re.search(r"at unit (\d+) .*unit(\d+)\.swap", str(failed.value)).groups()
    assert unit == file   # the unit named is the one whose file failed
    monkeypatch.undo()
    with pytest.raises(OverlapFailure, match="step 2"):   # and at every later reader
        dsfast.utils.safe_get_full_fp32_param(next(eng.module.parameters()))


def test_readers_right_after_step_find_the_states_written(tmp_path):
    """safe_get right after step() (the worker may still be walking): the settle drains the window's writes first,
    so the states read are the step's (as the serial run's)."""
    got = []
    for overlap in (False, True):
        eng = engine(2, overlap=overlap, nvme=tmp_path / f"o{overlap}")
        seen = []
        train(eng, 2, after_step=lambda e, s: seen.append(
            [dsfast.utils.safe_get_full_optimizer_state(p, "exp_avg_sq") for p in e.module.parameters()]))
        got.append(seen)
        eng.destroy()
    for a, b in zip(*got):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_explain_shows_the_key_on_with_nvme_states(tmp_path, capsys):
    import json
    from _overlap_helpers import config
    from dsfast.config.__main__ import main
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config(2, nvme=tmp_path / "swap")))   # accepted with nvme (no error)
    main([str(path), "--explain"])
    line = [x for x in capsys.readouterr().out.splitlines() if "overlap_step" in x]
    assert len(line) == 1 and "= True" in line[0] and "user" in line[0], line
    cfg = config(2, nvme=tmp_path / "swap")
    del cfg["zero_optimization"]["offload_optimizer"]["overlap_step"]   # the default: shown with its note
    path.write_text(json.dumps(cfg))
    main([str(path), "--explain"])
    line = [x for x in capsys.readouterr().out.splitlines() if "overlap_step" in x]
    assert len(line) == 1 and "= False" in line[0] and "cpu or nvme" in line[0], line


def test_a_checkpoint_saved_behind_the_walk_loads_and_trains_on_bitwise(tmp_path):
    """Saved right after step() (the worker still walking) and loaded into a fresh overlapped NVMe engine, whose
    load reads and writes the window while no step runs: the two engines then train on alike."""
    first = engine(2, nvme=tmp_path / "a")
    train(first, 2)
    first.save_checkpoint(str(tmp_path / "ckpt"), tag="t")
    second = engine(2, nvme=tmp_path / "b")
    train(second, 1)   # (states different from the checkpoint's, replaced by the load)
    second.load_checkpoint(str(tmp_path / "ckpt"), tag="t")
    la, lb = train(first, 2), train(second, 2)
    assert la == lb
    assert_same(snapshot(first), snapshot(second))
