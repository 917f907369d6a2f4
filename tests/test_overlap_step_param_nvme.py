"""offload_optimizer.overlap_step with stage 3's parameter shards on NVMe (offload_param.device "nvme"), one rank:
the worker writes each unit's new 16-bit shard through the parameters' window while the next forward's gathers read
it on the main thread (one lock around the window's calls: zero/nvme/params.py). Bitwise the serial step with the
states on cpu and on NVMe (fp32/bf16, clipping, a scheduler; fp16 skips and accumulation), under the test placement
and the chaos delays; readers right after step() (safe_get, GatheredParameters, a checkpoint) find the step's
values; a failed parameter write in the worker is raised at the next backward naming the unit and the step, never
in the forward's gathers. The window's one slot per unit under two threads is checked directly. The 2-rank row is
in tests/distributed/test_overlap_step_dp.py."""
import errno
import os
import re
import sys
import threading

import pytest
import torch

import dsfast
from _overlap_helpers import assert_same, batch, engine, snapshot, train
from dsfast.zero.nvme import io as nvme_io
from dsfast.zero.nvme.files import SwapDir
from dsfast.zero.nvme.io import SwapError, SwapIO
from dsfast.zero.nvme.window import UnitWindow
from dsfast.zero.step.overlap import OverlapFailure


@pytest.fixture(autouse=True)
def _placement_and_chaos(monkeypatch):
    monkeypatch.setenv("DSFAST_TEST_PLACEMENT", "distinct-host")
    monkeypatch.setenv("DSFAST_STREAM_CHAOS", "7")
    monkeypatch.setenv("DSFAST_STREAM_CHAOS_MS", "5")


def _engine(overlap, where, states="cpu", **kw):
    eng = engine(3, overlap=overlap, param_nvme=where / "params",
                 nvme=where / "states" if states == "nvme" else None, **kw)
    assert (eng.state_owner.overlap is not None) == overlap
    swap = eng.state_owner.param_swap
    assert swap is not None and swap.resident == [] and len(swap.records) == 6   # every shard in its file
    assert (eng.state_owner.store.swap is not None) == (states == "nvme")
    return eng


def _both(tmp_path, steps=4, gas=1, overflow_at=None, after_step=None, **kw):
    out = []
    for overlap in (False, True):
        eng = _engine(overlap, tmp_path / f"overlap{overlap}", **kw)
        seen = []
        losses = train(eng, steps, gas=gas, overflow_at=overflow_at,
                       after_step=None if after_step is None else lambda e, s: seen.append(after_step(e)))
        out.append((losses, snapshot(eng), seen))
        eng.destroy()
    return out


@pytest.mark.parametrize("states", ["cpu", "nvme"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bitwise_the_serial_step_with_clipping_and_a_scheduler(states, precision, tmp_path):
    (l0, s0, _), (l1, s1, _) = _both(tmp_path, states=states, precision=precision, clip=0.05, scheduler=True)
    assert l0 == l1
    assert_same(s0, s1)


def test_fp16_overflow_skip_and_accumulation(tmp_path):
    (l0, s0, _), (l1, s1, _) = _both(tmp_path, steps=3, gas=2, overflow_at=1, states="nvme", precision="fp16",
                                     clip=1.0)
    assert s1["steps"][2] >= 1   # (the injected overflow; fp16 at this scale skips another, serial alike)
    assert l0[2:] == l1[2:]
    assert_same(s0, s1)


def _read_right_after_step(eng):
    """What a reader right after step() gets (the worker may still be writing the shards): the 16-bit parameters
    (from their files), the fp32 masters and a moment."""
    params = list(eng.module.parameters())
    with dsfast.zero.GatheredParameters(params):
        whole = [p.detach().clone() for p in params]
    return whole + [dsfast.utils.safe_get_full_fp32_param(p) for p in params] + \
        [dsfast.utils.safe_get_full_optimizer_state(p, "exp_avg_sq") for p in params]


def test_readers_right_after_step_find_the_steps_values(tmp_path):
    (_, _, serial), (_, _, overlapped) = _both(tmp_path, steps=2, precision="bf16",
                                               after_step=_read_right_after_step)
    for a, b in zip(serial, overlapped):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_a_checkpoint_saved_right_after_step_loads_and_trains_on_bitwise(tmp_path):
    first = _engine(True, tmp_path / "a", states="nvme", precision="bf16")
    train(first, 2)
    first.save_checkpoint(str(tmp_path / "ckpt"), tag="t")   # (the worker may still be writing the shards)
    second = _engine(True, tmp_path / "b", states="nvme", precision="bf16")
    train(second, 1)   # (values different from the checkpoint's, replaced by the load)
    second.load_checkpoint(str(tmp_path / "ckpt"), tag="t")
    la, lb = train(first, 2), train(second, 2)
    assert la == lb
    assert_same(snapshot(first), snapshot(second))


@pytest.mark.parametrize("states", ["cpu", "nvme"])
def test_a_failed_parameter_write_in_the_worker_is_raised_at_the_next_backward_naming_unit_and_step(
        states, tmp_path, monkeypatch):
    eng = _engine(True, tmp_path, states=states)
    train(eng, 1)
    eng.state_owner.settle()
    swap = eng.state_owner.param_swap
    real = nvme_io.os.pwritev

    def fails_on_param2(fd, buffers, offset):   # (by file: the write-backs run on the I/O pool in no fixed order)
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith("param2.swap"):   # or its .new
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, buffers, offset)
    monkeypatch.setattr(nvme_io.os, "pwritev", fails_on_param2)
    x, y = batch(5)
    eng.backward(torch.nn.functional.mse_loss(eng(x), y))
    eng.step()   # returns: the worker writes the shards
    loss = torch.nn.functional.mse_loss(eng(x), y)   # its gathers meet the failed write: not raised here
    with pytest.raises(OverlapFailure, match=r"optimizer step 2 failed on rank 0 at unit (\d+) \(parameters .*"
                                             r"SwapError: NVMe swap write of '.*param2\.swap' at step 2 failed: "
                                             "No space left on device") as failed:
        eng.backward(loss)
    unit = int(re.search(r"at unit (\d+) ", str(failed.value))[1])
    assert swap.index[id(eng.state_owner.store.units[unit].slice16)] == 2   # the unit named is the file's
    monkeypatch.undo()
    with pytest.raises(OverlapFailure, match="step 2"):   # and at every later reader
        dsfast.utils.safe_get_full_fp32_param(next(eng.module.parameters()))


# ---- the parameters' window from two threads (zero/nvme/params.py) ---------------------------------------------

def _window(tmp_path, buffer_count=2):
    return UnitWindow(SwapIO(threads=2), SwapDir(str(tmp_path), 0), buffer_count, name="param{}.swap")


def _store(window, i, values):
    window.store(i, lambda buf: buf.view(0, values.numel(), values.dtype).copy_(values),
                 values.numel() * values.element_size())


def test_a_claim_takes_over_a_unit_read_ahead_and_a_later_acquire_finds_the_new_bytes(tmp_path):
    """The forward read unit 0 ahead (its old file) before the worker's step overwrote it: the claim waits that
    read and takes the slot over; the gather after the step gets the new bytes, and so does the file."""
    window = _window(tmp_path)
    old, new = torch.arange(1024, dtype=torch.float32), -torch.arange(1024, dtype=torch.float32)
    _store(window, 0, old)
    window.flush()
    assert window.prefetch(0) and window.state_of(0) == "reading"   # the gathers' read ahead
    buf = window.claim(0, 4096)   # the worker: nothing read, it writes all of it
    assert window.state_of(0) == "held" and window.in_use == 1   # the same slot, not a second one
    buf.view(0, 1024, torch.float32).copy_(new)
    window.release(0, 4096)
    assert window.prefetch(0) and window.state_of(0) == "writing"   # a read ahead now reads nothing
    assert torch.equal(window.acquire(0).view(0, 1024, torch.float32), new)
    window.discard(0)
    window.flush()
    raw = open(window.path(0), "rb").read()
    assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.float32)[:1024], new)
    window.close()


def _params_swap(tmp_path, n, numel, buffer_count=2):
    """An NvmeParams over `n` records of `numel` fp32 elements each, values r * 1000 + arange."""
    from types import SimpleNamespace
    from dsfast.zero.nvme.params import NvmeParams
    recs = [SimpleNamespace(shard=torch.arange(numel, dtype=torch.float32) + 1000 * r, shard_numel=numel,
                            dtype=torch.float32, swap=None) for r in range(n)]
    target = SimpleNamespace(max_in_cpu=0, buffer_count=buffer_count, path=str(tmp_path), pin=False, threads=2,
                             block_size=1 << 20, buffer_size=0)
    return NvmeParams(recs, target, 0), recs


def test_gathers_and_the_steps_writes_from_two_threads_keep_every_value(tmp_path):
    """As in an overlapped step: a worker overwrites every shard in turn (holding, read=False), round after round,
    while the main thread gathers each shard once the worker wrote it (its step_event), reading the next ones ahead
    in the last pass's order, before the worker claims them. Every gather gets the round's values, and the window
    never holds more than its buffers. Thread switches are forced often, so a window call made without the lock
    meets the other thread's in the middle."""
    n, numel, rounds = 8, 2048, 6
    swap, recs = _params_swap(tmp_path, n, numel, buffer_count=3)
    written = [[threading.Event() for _ in recs] for _ in range(rounds)]
    gathered = [threading.Event() for _ in range(rounds)]   # (the next step starts after the pass: the settle)
    errors = []

    def values(i, k):
        return torch.arange(numel, dtype=torch.float32) + 1000 * i + 100000 * (k + 1)

    def worker():
        try:
            for k in range(rounds):
                if k:
                    gathered[k - 1].wait()
                for i, r in enumerate(recs):
                    with swap.holding(r.shard, read=False) as shard:
                        shard.copy_(values(i, k))
                    written[k][i].set()
                swap.flush()
        except Exception as e:   # (surfaced below)
            errors.append(e)
            for done in sum(written, []):
                done.set()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        t = threading.Thread(target=worker)
        for r in recs:   # a first pass: the order to read ahead in
            swap.copy_of(r)
        swap.new_pass(read=False)
        t.start()
        for k in range(rounds):
            for i, r in enumerate(recs):
                written[k][i].wait()
                assert torch.equal(swap.copy_of(r), values(i, k)), (k, i)
            swap.new_pass(read=k % 2 == 0)   # (the next round's first shards read ahead, or not)
            gathered[k].set()
    finally:
        sys.setswitchinterval(interval)
        for done in gathered:   # (a failed assert above: the worker finishes its rounds all the same)
            done.set()
        t.join()
    assert not errors, errors
    assert swap.window.peak_in_use <= swap.window.buffer_count
    swap.close()


def test_a_gather_of_a_shard_the_step_holds_is_an_error(tmp_path):
    """A gather that did not wait for its unit's step would copy a buffer the step is writing: refused."""
    swap, recs = _params_swap(tmp_path, 2, 1024)
    with swap.holding(recs[1].shard, read=False, write=False):
        with pytest.raises(RuntimeError, match=r"parameter shard file 1 .* is held by the optimizer step"):
            swap.copy_of(recs[1])
    assert torch.equal(swap.copy_of(recs[1]), torch.arange(1024, dtype=torch.float32) + 1000)
    swap.close()


def test_a_gather_meeting_a_failed_write_hands_it_to_write_failed_and_reads_the_previous_file(tmp_path,
                                                                                           monkeypatch):
    swap, recs = _params_swap(tmp_path, 2, 1024)
    monkeypatch.setattr(nvme_io.os, "pwritev", lambda fd, buffers, offset: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    with swap.holding(recs[1].shard, read=False) as shard:   # the step's write of record 1 fails
        shard.fill_(7.0)
    failed = []
    swap.write_failed = failed.append   # (the overlapped step sets it while its writes may be in flight)
    got = swap.copy_of(recs[1])
    assert torch.equal(got, torch.arange(1024, dtype=torch.float32) + 1000)   # the file's previous version
    assert len(failed) == 1 and isinstance(failed[0], SwapError) and "param1.swap" in str(failed[0])
    # without it (no overlapped step), a gather raises the failed write as before
    swap.write_failed = None
    with swap.holding(recs[0].shard, read=False) as shard:
        shard.fill_(7.0)
    with pytest.raises(SwapError, match=r"write of '.*param0\.swap' failed: No space left on device"):
        swap.copy_of(recs[0])
    monkeypatch.undo()
    swap.close()
