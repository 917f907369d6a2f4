"""The checks NVMe offload runs at initialize, before it writes a file or allocates a buffer.

Each error names what is wrong, the numbers (bytes needed, bytes free) and what to change.
"""
import os
import resource
import tempfile

from ...optim.element_wise import states_per_element

_GIB = float(1 << 30)


def _size(n):
    return f"{n} bytes ({n / _GIB:.2f} GiB)"


def check_nvme_path(path, need_bytes, key="offload_optimizer.nvme_path"):
    """`path` exists, is a writable directory with `need_bytes` free (the swap files of this rank)."""
    if not os.path.exists(path):
        raise ValueError(f"{key}={path!r} does not exist; create the directory (on a fast local disk) or point "
                         f"{key} at one")
    if not os.path.isdir(path):
        raise ValueError(f"{key}={path!r} is not a directory; give a directory on a fast local disk")
    try:   # a real file, not os.access: root passes access() on a read-only mount too
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ValueError(f"{key}={path!r} is not writable by this process ({e.strerror}); give a directory it "
                         "can write") from None
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    if free < need_bytes:
        raise ValueError(f"{key}={path!r} has {_size(free)} free but the swap files need {_size(need_bytes)}; "
                         "free space there or use a larger disk")
    return free


MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


def filesystem_of(path):
    """The type of the filesystem `path` is on (the longest mount point above it in /proc/mounts), or None."""
    path = os.path.realpath(path)
    best, kind = "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None
    return kind


def memory_filesystem_note(path, key="offload_optimizer.nvme_path"):
    """A warning's text when `path` is on a filesystem kept in memory (the swapped states would still take host
    memory, and /dev/shm's share of it), else None."""
    kind = filesystem_of(path)
    if kind not in MEMORY_FILESYSTEMS:
        return None
    return (f"{key}={path!r} is on {kind}, which lives in host memory: the states swapped there still take host "
            "memory (and compete with /dev/shm), so NVMe offload saves nothing; point it at a directory on a disk")


def meminfo_available():
    """MemAvailable from /proc/meminfo in bytes (None where there is no /proc)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_host_memory(need_bytes, pinned_bytes=0, shm_bytes=0, lower="offload_optimizer.buffer_count",
                      available=None, memlock=None, shm_free=None):
    """Host memory for `need_bytes` of swap buffers (`pinned_bytes` of them page-locked, within `ulimit -l`) and
    `shm_bytes` of /dev/shm. `available`, `memlock`, `shm_free`: the measured limits (read here when None)."""
    available = meminfo_available() if available is None else available
    if available is not None and need_bytes > available:
        raise ValueError(f"NVMe offload: the host swap buffers need {_size(need_bytes)} but only "
                         f"{_size(available)} of host memory is available; lower {lower}")
    if pinned_bytes:
        memlock = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0] if memlock is None else memlock
        if memlock != resource.RLIM_INFINITY and pinned_bytes > memlock:
            raise ValueError(f"NVMe offload: pinning {_size(pinned_bytes)} of swap buffers exceeds `ulimit -l` "
                             f"({_size(memlock)}); raise it (ulimit -l unlimited), lower {lower}, or set "
                             "pin_memory to false")
    if shm_bytes:
        if shm_free is None:
            st = os.statvfs("/dev/shm")
            shm_free = st.f_bavail * st.f_frsize
        if shm_bytes > shm_free:
            raise ValueError(f"NVMe offload: /dev/shm needs {_size(shm_bytes)} but has {_size(shm_free)} free; "
                             f"enlarge /dev/shm (docker: --shm-size) or lower {lower}")


def check_host_states(masters, optimizer, local_ranks, available=None):
    """The optimizer states of `masters` (this rank's, in host memory) that the first step will create fit in the
    host's available memory, counting every rank on this host alike; else an error before training starts
    instead of the OOM killer at the first step."""
    per_element = states_per_element(optimizer)
    if not per_element:
        return
    fp32 = getattr(optimizer, "fp32_optimizer_states", False)   # dsfast's CPU optimizers; torch's: the master's
    need = sum(m.numel() * per_element * (4 if fp32 else m.element_size()) for m in masters)
    available = meminfo_available() if available is None else available
    if available is None or need * local_ranks <= available:
        return
    raise ValueError(f"the optimizer states of this rank's {sum(m.numel() for m in masters)} parameter elements "
                     f"need {_size(need)} of host memory ({local_ranks} rank(s) on this host: "
                     f"{_size(need * local_ranks)}) but only {_size(available)} is available, so the first step "
                     "would run out of memory. Keep them on a disk with zero_optimization.offload_optimizer "
                     "{\"device\": \"nvme\", \"nvme_path\": ...} (and at stage 3 offload_param too), or spread "
                     "the model over more ranks and hosts")
