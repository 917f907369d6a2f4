"""The NVMe swap I/O layer (zero/nvme/buffers.py, nvme_io.py): aligned buffers, O_DIRECT and buffered reads and
writes from the pool, bit-exact round trips, and the faults: a refused O_DIRECT, a full disk, a failed or short
transfer, each an error naming the file (and the step) with the previous file intact."""
import errno
import os

import pytest
import torch

from dsfast.zero.nvme import io as nvme_io
from dsfast.zero.nvme.buffers import ALIGN, HostBuffer, aligned_size
from dsfast.zero.nvme.io import SwapError, SwapIO
from _nvme_helpers import mounted_tmpfs, refuse_o_direct


def _filled(nbytes, seed):
    buf = HostBuffer(nbytes)
    g = torch.Generator().manual_seed(seed)
    buf.tensor[:nbytes].copy_(torch.randint(0, 256, (nbytes,), generator=g, dtype=torch.uint8))
    return buf


def test_buffers_are_aligned_at_their_exact_rounded_size():
    for n in (1, 4095, 4096, 4097, 3 * ALIGN + 5):
        b = HostBuffer(n)
        assert b.nbytes == aligned_size(n) == b.tensor.numel() and b.nbytes - n < ALIGN
        assert b.tensor.data_ptr() % ALIGN == 0 and not b.pinned
    v = HostBuffer(64).view(8, 4, torch.float32)
    assert v.shape == (4,) and v.dtype == torch.float32
    with pytest.raises(ValueError, match="does not fit"):
        HostBuffer(64).view(4090, 4, torch.float32)


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
def test_write_then_read_is_bit_exact_and_counted(tmp_path, direct):
    io = SwapIO(threads=2, block_size=8192, direct=direct)   # several blocks per file
    sizes = [1, 4096, 50_000, 3 * 8192]
    srcs = [_filled(n, i) for i, n in enumerate(sizes)]
    futs = [io.write(str(tmp_path / f"u{i}"), b, n) for i, (b, n) in enumerate(zip(srcs, sizes))]
    for f in futs:
        f.result()
    dsts = [HostBuffer(n) for n in sizes]
    for f in [io.read(str(tmp_path / f"u{i}"), b, n) for i, (b, n) in enumerate(zip(dsts, sizes))]:
        f.result()
    for s, d, n in zip(srcs, dsts, sizes):
        assert torch.equal(s.tensor[:n], d.tensor[:n])
        assert open(tmp_path / f"u{sizes.index(n)}", "rb").read()[:n] == bytes(s.tensor[:n].numpy())
    total = sum(aligned_size(n) for n in sizes)
    assert io.bytes_written == total and io.bytes_read == total
    assert io.direct == direct and not io.notes
    assert not [p for p in os.listdir(tmp_path) if p.endswith(nvme_io.NEW_SUFFIX)]
    io.close()


def test_a_refused_o_direct_falls_back_to_buffered_with_a_note(tmp_path, monkeypatch):
    refuse_o_direct(monkeypatch)
    io = SwapIO()
    src, dst = _filled(10_000, 1), HostBuffer(10_000)
    io.write(str(tmp_path / "u"), src, 10_000).result()
    io.read(str(tmp_path / "u"), dst, 10_000).result()
    assert torch.equal(src.tensor, dst.tensor)
    assert not io.direct and len(io.notes) == 1 and str(tmp_path) in io.notes[0] and "O_DIRECT" in io.notes[0]


def test_a_failed_write_names_file_and_step_and_keeps_the_previous_file(tmp_path, monkeypatch):
    io = SwapIO(direct=False)
    path = str(tmp_path / "unit3.swap")
    old = _filled(8192, 1)
    io.write(path, old, 8192).result()

    def broken(fd, buffers, offset):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(nvme_io.os, "pwritev", broken)
    with pytest.raises(SwapError, match=r"write of '.*unit3\.swap' at step 7 failed: Input/output error.*intact"):
        io.write(path, _filled(8192, 2), 8192, step=7).result()
    assert open(path, "rb").read() == bytes(old.tensor.numpy())
    assert os.listdir(tmp_path) == ["unit3.swap"]


def test_a_write_over_a_spare_reuses_it_and_retires_the_previous_file(tmp_path, monkeypatch):
    io = SwapIO()
    path, spare = str(tmp_path / "unit0.swap"), str(tmp_path / "spare0.swap")
    first, second, third = _filled(8192, 1), _filled(8192, 2), _filled(4096, 3)
    io.write(path, first, 8192, spare=spare).result()     # no spare file yet: created
    assert sorted(os.listdir(tmp_path)) == ["unit0.swap"]
    io.write(path, second, 8192, spare=spare).result()    # the first version retires as the spare
    assert open(spare, "rb").read() == bytes(first.tensor.numpy())
    inode = os.stat(spare).st_ino
    io.write(path, third, 4096, spare=spare).result()     # written into the spare's blocks, in place
    assert os.stat(path).st_ino == inode and open(path, "rb").read() == bytes(third.tensor.numpy())
    assert os.path.getsize(path) == 4096   # the larger spare's tail is cut off: no disk kept for nothing
    assert open(spare, "rb").read() == bytes(second.tensor.numpy())

    def broken(fd, buffers, offset):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(nvme_io.os, "pwritev", broken)
    with pytest.raises(SwapError, match="unit0.swap' at step 4 failed"):
        io.write(path, first, 8192, step=4, spare=spare).result()
    assert open(path, "rb").read()[:4096] == bytes(third.tensor.numpy())   # the unit's file untouched
    assert sorted(os.listdir(tmp_path)) == ["spare0.swap", "unit0.swap"]


def test_a_truncated_file_is_a_short_read_naming_it(tmp_path):
    io = SwapIO()
    path = str(tmp_path / "u")
    io.write(path, _filled(8192, 1), 8192).result()
    os.truncate(path, 4096)
    with pytest.raises(SwapError, match=r"read of '.*u' failed: short read: 4096 of 8192"):
        io.read(path, HostBuffer(8192), 8192).result()
    with pytest.raises(SwapError, match="read of '.*missing' at step 2 failed: No such file"):
        io.read(str(tmp_path / "missing"), HostBuffer(10), 10, step=2).result()


def test_bad_pool_arguments_are_refused():
    with pytest.raises(ValueError, match="threads=0"):
        SwapIO(threads=0)
    with pytest.raises(ValueError, match="block_size=0"):
        SwapIO(block_size=0)


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 64 KiB filesystem (tmpfs mounted here: needs root), to run out of space on."""
    with mounted_tmpfs(tmp_path / "disk", "size=64k") as where:
        yield where


def test_a_full_disk_is_a_clear_error_and_the_previous_file_stays(tiny_disk):
    io = SwapIO()
    path = str(tiny_disk / "unit0.swap")
    old = _filled(40_960, 1)
    io.write(path, old, 40_960).result()      # fits; the next one needs room for the new file beside the old
    with pytest.raises(SwapError, match=r"write of '.*unit0\.swap' at step 5 failed: No space left on device"):
        io.write(path, _filled(40_960, 2), 40_960, step=5).result()
    assert open(path, "rb").read() == bytes(old.tensor.numpy())
    assert os.listdir(tiny_disk) == ["unit0.swap"]   # the partial new file is gone
