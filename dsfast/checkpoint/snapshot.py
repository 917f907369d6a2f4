"""Host copies of the tensors an asynchronous save writes, in buffers kept from one save to the next.

A fresh host buffer for every tensor of every save costs page faults (the kernel zeroes each new page): on a
model of 100M parameters that was most of the training stall of an async save, every time. The buffers of the
previous save are reused (same name, size and dtype), which is safe because a save first waits for the previous
one's writer. They stay allocated between saves: one snapshot's worth of host memory while async saves are used
(release() gives it back).
"""
import torch

_buffers = {}


def host_copy(key, tensor):
    """`tensor` copied into the kept host buffer for `key` (a new one when it does not fit)."""
    src = tensor.detach()
    buf = _buffers.get(key)
    if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
        buf = torch.empty(src.shape, dtype=src.dtype, device="cpu",
                          pin_memory=src.device.type == "cuda")
        _buffers[key] = buf
    buf.copy_(src, non_blocking=src.device.type == "cuda")
    return buf


def release():
    _buffers.clear()
