"""Where a ZeRO owner's tensors live: one policy, decided once from the config and handed to the storage.

    device       the compute device: model-dtype parameters, gradients as autograd produces them, reductions
    states       fp32 masters and optimizer states: the host with offload_optimizer, else the device
    nvme         offload_optimizer on NVMe (an NvmeTarget): the states live in swap files, a window of them on
                 the host (nvme_states.py); never the parameters' memory, so the masters do not alias them
    params       stage 3's parameter shards: the host with offload_param, else the device
    nvme_params  offload_param on NVMe (an NvmeTarget): the shards live in swap files, read through a window of
                 host buffers (nvme_params.py); the masters do not alias them either
    pin          the host fp32 masters are page-locked (offload_optimizer.pin_memory, with a GPU); the staging
                 buffers of the copies always are, with a GPU
    distinct     host memory is not the device's: offloaded tensors need copies (gradient shards to the host as
                 their reduction completes, updated 16-bit values back), each on a side stream (the store's lanes)
                 with an event per unit that the reader waits for

With a GPU `distinct` is true. On CPU ranks host and device are one memory, so offload changes nothing there, and the
copies, their order and the buffers they read would run only on a GPU, that is, never in CI. The test placement
(DSFAST_TEST_PLACEMENT=distinct-host) makes them distinct CPU buffers: every offload copy then runs on CPU ranks,
with the same code a GPU runs (the side streams are worker threads there: accelerator/streams.py).
"""
import os
from dataclasses import dataclass
from typing import Optional

import torch

TEST_PLACEMENT_ENV = "DSFAST_TEST_PLACEMENT"
HOST = torch.device("cpu")


@dataclass(frozen=True)
class NvmeTarget:
    """Where and how a unit's states are swapped: offload_optimizer's nvme_path, buffer_count, pinning of the
    window's buffers (with a GPU), and the I/O pool (aio.thread_count / intra_op_parallelism, aio.block_size)."""
    path: str
    buffer_count: int
    pin: bool = False
    threads: int = 2
    block_size: int = 1 << 20
    buffer_size: int = 0    # offload_param: elements of DeepSpeed's swap buffers (a note where a shard is larger)
    max_in_cpu: int = 0     # offload_param: elements of shards kept in host memory instead of swapped


@dataclass(frozen=True)
class Placement:
    device: torch.device
    offload_states: bool = False
    offload_params: bool = False
    pin: bool = False
    distinct: bool = False
    nvme: Optional[NvmeTarget] = None
    nvme_params: Optional[NvmeTarget] = None

    @property
    def states_device(self):
        return HOST if self.offload_states else self.device

    @property
    def params_device(self):
        return HOST if self.offload_params else self.device

    @property
    def copies_states(self):
        """Gradient shards go to the host and updated 16-bit values come back (offload_optimizer, distinct)."""
        return self.offload_states and self.distinct

    def masters_alias(self, mixed, params_offloaded=False):
        """An fp32 model's masters may be its parameter shards themselves: one copy, when both sit on one side."""
        if self.nvme is not None or self.nvme_params is not None:
            return False
        return not mixed and (not self.distinct or self.offload_states == params_offloaded)

    def host_empty(self, numel, dtype):
        """A staging buffer on the host that the device copies into or out of (pinned where a GPU does so)."""
        return torch.empty(numel, dtype=dtype, device=HOST, pin_memory=self.device.type == "cuda")

    def host_copy(self, t):
        """A host copy of `t` (a distinct buffer even on CPU ranks); pinned where a GPU copies from it."""
        out = self.host_empty(t.numel(), t.dtype).view(t.shape)
        return out.copy_(t)

    def synchronize(self):
        """The device's queued copies on the compute stream have landed (stage 3's NVMe parameter buffers: their
        gathers copy out of them there)."""
        if self.distinct and self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


def placement_of(zero_cfg, device, aio=None):
    """The placement for a `zero_optimization` config section on `device` (the engine's device); aio: the
    config's aio section (dict or None), for the NVMe swap's I/O pool."""
    device = torch.device(device)
    nvme = zero_cfg.offload_optimizer_device == "nvme"
    states = zero_cfg.offload_optimizer_device in ("cpu", "nvme")
    params = zero_cfg.offload_param_device in ("cpu", "nvme")
    gpu = device.type == "cuda"
    test = os.environ.get(TEST_PLACEMENT_ENV, "")
    if test not in ("", "distinct-host"):
        raise ValueError(f"{TEST_PLACEMENT_ENV}={test!r}: valid values are 'distinct-host' (CPU test placement: "
                         "host buffers apart from the device's) or unset")
    pin_asked = gpu and states and bool(zero_cfg.offload_optimizer.pin_memory)
    target = None
    if nvme:
        off = zero_cfg.offload_optimizer
        target = NvmeTarget(off.nvme_path, off.buffer_count, pin=pin_asked, **aio_pool(aio))
    param_target = None
    if zero_cfg.offload_param_device == "nvme":
        off = zero_cfg.offload_param
        param_target = NvmeTarget(off.nvme_path, off.buffer_count, pin=gpu and bool(off.pin_memory),
                                  buffer_size=off.buffer_size, max_in_cpu=off.max_in_cpu, **aio_pool(aio))
    return Placement(device, states, params, pin_asked and not nvme, distinct=gpu or test == "distinct-host",
                     nvme=target, nvme_params=param_target)


def aio_pool(aio):
    """The I/O pool's settings from DeepSpeed's aio section: threads (intra_op_parallelism or thread_count, at
    least 2 so that a read and a write run together) and block_size (bytes per read or write call)."""
    aio = aio or {}
    threads = aio.get("intra_op_parallelism", aio.get("thread_count", 2))
    return {"threads": max(2, int(threads)), "block_size": int(aio.get("block_size", 1 << 20))}
