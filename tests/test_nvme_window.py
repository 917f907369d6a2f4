"""The window of units over their swap files (zero/nvme/window.py): every unit really goes to disk and back
bit-exactly, the window never holds more than buffer_count units, reads and writes run in the pool while the
caller computes, and an I/O error reaches the caller."""
import errno
import os
import time

import pytest
import torch

from dsfast.zero.nvme import io as nvme_io
from dsfast.zero.nvme.files import SwapDir
from dsfast.zero.nvme.io import SwapError, SwapIO
from dsfast.zero.nvme.window import HELD, UnitWindow, WRITING

SIZES = [4, 5000, 33, 16384, 7, 2500]   # fp32 elements per unit: sizes that do and do not fill an aligned block
# (units 0, 2 and 4, one page each, are small beside unit 3's 16 pages: nvme/window.py SMALL_SHARE)


@pytest.fixture
def window(tmp_path):
    io, d = SwapIO(threads=2), SwapDir(tmp_path)
    w = UnitWindow(io, d, buffer_count=2)
    yield w
    w.close()
    io.close()
    d.close()


def _store_all(w, seed=0):
    g = torch.Generator().manual_seed(seed)
    values = [torch.randn(n, generator=g) for n in SIZES]
    for i, v in enumerate(values):
        w.store(i, lambda buf, v=v: buf.view(0, v.numel(), torch.float32).copy_(v), v.numel() * 4)
    return values


def test_every_unit_goes_to_disk_and_back_bit_exactly(window):
    values = _store_all(window)
    window.flush()
    for i, v in enumerate(values):   # the files hold the values (not just the buffers)
        on_disk = torch.frombuffer(bytearray(open(window.path(i), "rb").read()), dtype=torch.float32)
        assert torch.equal(on_disk[:v.numel()], v)
    for sweep in range(3):   # a few "steps": each updates every unit in place
        window.prefetch(0)
        for i, v in enumerate(values):
            if i + 1 < len(values):
                window.prefetch(i + 1)
            buf = window.acquire(i)
            t = buf.view(0, v.numel(), torch.float32)
            assert torch.equal(t, v), (sweep, i)
            t.mul_(0.5).add_(i)
            v.mul_(0.5).add_(i)
            window.release(i, v.numel() * 4)
            assert window.in_use <= window.buffer_count
    window.flush()
    assert window.peak_in_use == window.buffer_count == 2
    # the disk holds the units and at most one spare per write in flight (retired versions, overwritten by later
    # writes): a buffer's, or a small unit's
    files = os.listdir(window.dir.path)
    small = sum(window.is_small(i) for i in range(len(SIZES)))
    assert small == 3 and 0 < window.spare_files <= 2 + small and len(files) == len(SIZES) + window.spare_files
    # every unit read in the first sweep; then the small ones, their writes still in flight (no buffer was
    # wanted: they are outside the buffers), are used again without a read, as a released unit is
    per_unit = [-(-n * 4 // 4096) * 4096 for n in SIZES]
    assert window.io.bytes_read == sum(per_unit) + 2 * sum(b for i, b in enumerate(per_unit) if not window.is_small(i))
    for i, v in enumerate(values):
        assert torch.equal(window.acquire(i).view(0, v.numel(), torch.float32), v)
        window.discard(i)


def test_the_window_never_holds_more_than_buffer_count(window):
    _store_all(window)   # units 1, 3, 5 take a buffer; 0, 2, 4 are small
    assert [window.is_small(i) for i in range(len(SIZES))] == [True, False, True, False, True, False]
    assert window.prefetch(1) and window.prefetch(3)
    assert not window.prefetch(5)   # both buffers hold units being read: nothing is evicted for a prefetch
    window.acquire(1)
    window.acquire(3)
    with pytest.raises(RuntimeError, match="window is full: all 2 host buffers.*raise buffer_count"):
        window.acquire(5)
    window.release(1, SIZES[1] * 4)
    assert window.state_of(1) == WRITING
    window.acquire(5)   # reuses unit 1's buffer once its write landed
    assert window.state_of(1) is None and window.state_of(5) == HELD and window.in_use == 2
    with pytest.raises(RuntimeError, match=r"release\(1\): unit 1 is not acquired"):
        window.release(1, 4)
    # a small unit takes none of the buffers: read with both held, in a buffer of its own size, freed with it
    window.flush()   # (the small units' buffers, kept while their writes were in flight, go)
    held = len(window.buffers())
    buf = window.acquire(2)
    assert window.in_use == 2 and len(window.buffers()) == held + 1 and buf.nbytes == 4096
    window.discard(2)
    assert len(window.buffers()) == held and window.peak_in_use == 2
    with pytest.raises(KeyError, match="unit 9 has no swap file"):
        window.prefetch(9)
    with pytest.raises(ValueError, match="buffer_count=0"):
        UnitWindow(window.io, window.dir, 0)


def test_a_released_unit_wanted_again_is_not_read_back(window):
    values = _store_all(window)
    window.flush()
    read = window.io.bytes_read
    buf = window.acquire(3)
    buf.view(0, 1, torch.float32).fill_(42.0)
    window.release(3, SIZES[3] * 4)
    again = window.acquire(3)   # still in the window: the same bytes, after its write landed
    assert again is buf and window.io.bytes_read == read + SIZES[3] * 4 // 4096 * 4096
    assert float(again.view(0, 1, torch.float32)) == 42.0 and values[3].numel() == SIZES[3]


def test_grow_keeps_the_bytes_and_the_file_takes_the_new_size(window):
    _store_all(window)
    buf = window.acquire(0)
    first = buf.view(0, 4, torch.float32).clone()
    big = window.grow(0, 3 * 4096 + 4)
    assert big.nbytes == 4 * 4096 and torch.equal(big.view(0, 4, torch.float32), first)
    big.view(3 * 4096, 1, torch.float32).fill_(7.0)
    window.release(0, 3 * 4096 + 4)
    window.flush()
    again = window.acquire(0)
    assert float(again.view(3 * 4096, 1, torch.float32)) == 7.0


class _Timed(SwapIO):
    """A pool whose transfers take 50 ms and are logged (name, start, end)."""

    def __init__(self):
        super().__init__(threads=2)
        self.log = []

    def _timed(self, what, fn, path, *a):
        t0 = time.perf_counter()
        time.sleep(0.05)
        fn(path, *a)
        self.log.append((what, path.rsplit("unit", 1)[1], t0, time.perf_counter()))

    def _read(self, path, buffer, n):
        self._timed("read", super()._read, path, buffer, n)

    def _write(self, path, buffer, n, spare=None):
        self._timed("write", super()._write, path, buffer, n, spare)


def test_reads_and_writes_overlap_the_callers_compute(tmp_path):
    io, d = _Timed(), SwapDir(tmp_path)
    w = UnitWindow(io, d, buffer_count=3, name="unit{}")
    for i in range(3):
        w.store(i, lambda buf: None, 4096)
    w.flush()
    io.log.clear()
    computes = []
    w.prefetch(0)
    for i in range(3):
        if i + 1 < 3:
            w.prefetch(i + 1)
        w.acquire(i)
        t0 = time.perf_counter()
        time.sleep(0.15)   # the caller's work on unit i
        computes.append((t0, time.perf_counter()))
        w.release(i, 4096)
    w.flush()
    ev = {(what, unit): (a, b) for what, unit, a, b in io.log}
    # while the caller computed on unit 1, unit 2 was read and unit 0 written; unit 1 written during unit 2
    assert computes[1][0] < ev[("read", "2")][1] < computes[1][1]
    assert computes[1][0] < ev[("write", "0")][1] < computes[1][1]
    assert computes[2][0] < ev[("write", "1")][1] < computes[2][1]
    w.close()
    io.close()
    d.close()


def test_an_io_error_reaches_the_caller(window, monkeypatch):
    _store_all(window)
    window.flush()
    window.step = 12
    window.acquire(0)

    def full(fd, buffers, offset):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(nvme_io.os, "pwritev", full)
    window.release(0, SIZES[0] * 4)
    with pytest.raises(SwapError, match=r"write of '.*unit0\.swap' at step 12 failed: No space left"):
        window.flush()
    assert window.in_use == 0
    monkeypatch.undo()
    with open(window.path(1), "r+b") as f:   # a unit whose file lost its tail
        f.truncate(0)
    with pytest.raises(SwapError, match=r"read of '.*unit1\.swap' at step 12 failed: short read"):
        window.acquire(1)
    assert window.in_use == 0
