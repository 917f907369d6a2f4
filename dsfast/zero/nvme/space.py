"""What both NVMe placements (nvme_states.py: the optimizer's states, nvme_params.py: stage 3's parameter shards)
own: a rank's swap directory, its I/O pool and a window of host buffers, set up only after the checks passed."""
import warnings

from .checks import check_host_memory, check_nvme_path, memory_filesystem_note
from .files import SwapDir
from .io import SwapIO
from .window import UnitWindow


class SwapSpace:
    def __init__(self, path, rank, file_bytes, buffer_count, window_bytes, pin=False, threads=2,
                 block_size=1 << 20, key="offload_optimizer", lower="buffer_count", name="unit{}.swap"):
        """Checks `path` (room for `file_bytes` of files plus the window's worth being replaced; a memory
        filesystem warns) and host memory for the window (`window_bytes`, page-locked with `pin`), before
        anything is written or allocated; `lower` says what shrinks the window. Names `key` in every message."""
        check_nvme_path(path, file_bytes + window_bytes, key=f"{key}.nvme_path")
        note = memory_filesystem_note(path, key=f"{key}.nvme_path")
        if note is not None:
            warnings.warn(note)
        check_host_memory(window_bytes, pinned_bytes=window_bytes if pin else 0, lower=lower)
        self.dir = SwapDir(path, rank)
        self.io = SwapIO(threads=threads, block_size=block_size)
        self.window = UnitWindow(self.io, self.dir, buffer_count, pin=pin, name=name)

    @property
    def nvme_bytes(self):
        """Bytes of this rank's swap files on disk (with the spares of the writes in flight)."""
        return self.dir.nbytes

    def host_buffers(self):
        return [b.tensor for b in self.window.buffers()]

    def close(self):
        try:
            self.window.close()
        finally:
            self.io.close()
            self.dir.close()
