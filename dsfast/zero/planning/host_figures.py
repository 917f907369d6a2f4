"""What this machine has for an offload plan (dsfast.zero.planning.plan): host memory, `ulimit -l`, /dev/shm, the
in-place
memory bandwidth, the accelerator's memory, and an NVMe directory's O_DIRECT bandwidth and free space.

Every measurement is short (about a second) and every figure can be given instead of measured (HostFigures
fields), so a plan can be made for another machine and tests can fix the figures.
"""
import dataclasses
import os
import resource
import threading
import time
from typing import Optional

import torch

from ..nvme.checks import meminfo_available, memory_filesystem_note

CEILING_BYTES = 12   # a += s * b: read a, read b, write a (4 bytes each)
DISK_CHUNK = 8 << 20  # bytes per O_DIRECT call of the disk measurement


class Ceiling:
    """The in-place memory-bandwidth ceiling, measured as an in-place kernel like the optimizers themselves (the
    CPU optimizer benchmark samples it beside every timing)."""

    def __init__(self, n, device="cpu"):
        self.a = torch.rand(n, device=device)
        self.b = torch.rand(n, device=device)
        self.n = n

    def sample(self):
        """GB/s of one a += s * b pass."""
        sync = torch.cuda.synchronize if self.a.is_cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        self.a.add_(self.b, alpha=1e-7)
        sync()
        return CEILING_BYTES * self.n / (time.perf_counter() - t0) / 1e9


def memory_bandwidth_gbs(seconds=1.0, nbytes=256 << 20, device="cpu"):
    """The best in-place GB/s over about `seconds` of passes over two buffers of `nbytes` each (well beyond any
    cache; the best pass is the one least disturbed by other processes)."""
    c = Ceiling(max(int(nbytes) // 4, 1), device)
    best, end = c.sample(), time.perf_counter() + float(seconds)
    while time.perf_counter() < end:
        best = max(best, c.sample())
    return best


def disk_bandwidth(path, total, streams=1):
    """(write MB/s, read MB/s) of O_DIRECT streams over one file of `total` bytes in DISK_CHUNK calls: one stream
    (the disk's sequential bandwidth), or `streams` threads each on its own part. The file is removed."""
    from ..nvme.buffers import HostBuffer
    bufs = [HostBuffer(DISK_CHUNK) for _ in range(streams)]
    for b in bufs:
        b.tensor.random_(0, 256)   # not zeros: some disks compress
    f = os.path.join(path, ".dsfast-bandwidth.bin")
    part = max(total // streams // DISK_CHUNK, 1) * DISK_CHUNK

    def run(flags, call):
        fd = os.open(f, flags | os.O_DIRECT, 0o600)

        def stream(k):
            for off in range(k * part, (k + 1) * part, DISK_CHUNK):
                call(fd, [bufs[k].memoryview()], off)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=stream, args=(k,)) for k in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if flags & os.O_WRONLY:
            os.fsync(fd)
        took = time.perf_counter() - t0
        os.close(fd)
        return part * streams / took / 1e6
    try:
        return run(os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.pwritev), run(os.O_RDONLY, os.preadv)
    finally:
        if os.path.exists(f):
            os.unlink(f)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@dataclasses.dataclass
class HostFigures:
    """One machine's figures. Bytes, GB/s; None: not known (not measured, or no such thing)."""
    host_available: Optional[int] = None     # MemAvailable: for all local ranks together
    memlock: Optional[int] = None            # ulimit -l in bytes (None: unlimited)
    shm_size: Optional[int] = None
    shm_free: Optional[int] = None
    host_gbs: Optional[float] = None         # in-place bandwidth of host memory
    device_memory: Optional[int] = None      # one accelerator's memory (None: no accelerator: the CPU trains)
    device_gbs: Optional[float] = None       # its in-place bandwidth
    nvme_path: Optional[str] = None
    nvme_free: Optional[int] = None
    nvme_read_gbs: Optional[float] = None
    nvme_write_gbs: Optional[float] = None


def _positive(name, value):
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0 (got {value!r})")
    return value


def measure_host(nvme_path=None, bandwidth=True, disk_mib=256, **given):
    """HostFigures of this machine; `given` fields (HostFigures' names) are taken as they are, not measured.
    bandwidth=False skips the bandwidth measurements (their fields stay None unless given)."""
    unknown = set(given) - {f.name for f in dataclasses.fields(HostFigures)}
    if unknown:
        raise ValueError(f"unknown host figure(s) {sorted(unknown)}; known: "
                         f"{[f.name for f in dataclasses.fields(HostFigures)]}")
    for name, value in given.items():
        if name != "nvme_path":
            _positive(name, value)
    fig = HostFigures(nvme_path=nvme_path, **{k: v for k, v in given.items() if v is not None})
    if fig.host_available is None:
        fig.host_available = meminfo_available()
    if "memlock" not in given:
        soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
        fig.memlock = None if soft == resource.RLIM_INFINITY else soft
    if fig.shm_size is None and os.path.isdir("/dev/shm"):
        st = os.statvfs("/dev/shm")
        fig.shm_size, fig.shm_free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    if fig.device_memory is None and torch.cuda.is_available():
        fig.device_memory = torch.cuda.mem_get_info()[1]
    if bandwidth and fig.host_gbs is None:
        fig.host_gbs = memory_bandwidth_gbs()
    if bandwidth and fig.device_gbs is None and torch.cuda.is_available():
        fig.device_gbs = memory_bandwidth_gbs(0.5, 1 << 30, "cuda")
    if nvme_path is not None:
        if not os.path.isdir(nvme_path):
            raise ValueError(f"nvme_path {nvme_path!r} is not a directory; give an existing directory on the disk "
                             "to plan for")
        if fig.nvme_free is None:
            fig.nvme_free = free_bytes(nvme_path)
        note = memory_filesystem_note(nvme_path, "nvme_path")
        if note:
            raise ValueError(note)
        if bandwidth and (fig.nvme_read_gbs is None or fig.nvme_write_gbs is None):
            try:
                w, r = disk_bandwidth(nvme_path, int(disk_mib) << 20)
            except OSError as e:
                why = e.strerror or str(e)
                raise ValueError(f"nvme_path {nvme_path!r}: the O_DIRECT bandwidth measurement failed ({why}); give "
                                 "the disk's figures instead (--disk-read-gbs, --disk-write-gbs)") from None
            fig.nvme_write_gbs = fig.nvme_write_gbs or w / 1e3
            fig.nvme_read_gbs = fig.nvme_read_gbs or r / 1e3
    return fig
