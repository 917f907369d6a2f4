"""Aligned host buffers for the NVMe swap: exact size, page aligned, pinned only where a GPU copies from them.

O_DIRECT needs the address, the length and the file offset aligned to the disk's logical block (512 B or 4 KiB).
An anonymous mmap is page aligned and holds exactly the pages asked for; torch's pinned allocator would round a
request up to a power of two (DeepSpeed's host OOM), so pinning registers the mmap's pages with CUDA instead.
"""
import mmap

import torch

ALIGN = 4096   # a page: at least the logical block size of every disk O_DIRECT accepts


def aligned_size(nbytes):
    """`nbytes` rounded up to ALIGN (what an O_DIRECT transfer of them moves)."""
    return -(-int(nbytes) // ALIGN) * ALIGN


class HostBuffer:
    """`nbytes` (rounded up to ALIGN) of page-aligned host memory; `.tensor` is a uint8 view of all of it."""

    def __init__(self, nbytes, pin=False):
        self.nbytes = aligned_size(max(int(nbytes), 1))
        self._map = mmap.mmap(-1, self.nbytes)
        self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
        self.pinned = False
        if pin:
            _register(self.tensor)
            self.pinned = True

    def view(self, offset, numel, dtype):
        """`numel` elements of `dtype` at byte `offset` (a tensor sharing this buffer's memory)."""
        size = torch.empty(0, dtype=dtype).element_size()
        if offset % size or offset + numel * size > self.nbytes:
            raise ValueError(f"HostBuffer.view: {numel} x {dtype} at byte {offset} does not fit a buffer of "
                             f"{self.nbytes} bytes aligned to {size}")
        return self.tensor[offset:offset + numel * size].view(dtype)

    def memoryview(self, start=0, stop=None):
        return memoryview(self._map)[start:self.nbytes if stop is None else stop]

    def free(self):
        """Drop this buffer's memory (torch's views keep the mapping alive until the last of them goes)."""
        if self._map is None:
            return
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            self.pinned = False
        self.tensor, self._map = None, None


def _register(t):
    err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)
    if int(err) != 0:
        raise RuntimeError(f"pinning {t.numel()} bytes of swap buffer failed ({err}); check `ulimit -l` or set "
                           "offload_optimizer.pin_memory / offload_param.pin_memory to false")
