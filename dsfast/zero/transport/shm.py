"""The same-host shared-memory table that gradient reductions and stage 3's gathers go through (CPU training on
gloo, every rank on one machine).

gloo reduces over TCP even between processes on one host: every byte crosses the kernel twice and a gloo thread per
rank spends ~10 ms of CPU per step on the benchmark GPT. A SharedTable is one /dev/shm tensor of shape [world, numel]
(row r = rank r's buffers), mapped by every rank; a reduction through it (transports.ShmComm) is a rendezvous, then
each rank sums its own column chunk over all rows. Only one-element collectives cross process boundaries.

Used when: gloo backend, every rank on this host, fp32 CPU buffers, /dev/shm has room, and DSFAST_SHM_ALLREDUCE is
not "0". Anything else keeps gloo's collectives (transports.C10dComm).
"""
import os
import socket
import uuid

import torch
import torch.distributed as dist


SHM_DIR = "/dev/shm"


def _same_host(group):
    names = [None] * dist.get_world_size(group)
    dist.all_gather_object(names, socket.gethostname(), group=group)
    return len(set(names)) == 1


def shm_allocator(world_size, group=None):
    """An allocator for GradBuffers that puts the buckets in a shared table, or None when it cannot be used.

    Every rank must call this (it runs collectives). The returned callable records the table it made."""
    if world_size < 2 or os.environ.get("DSFAST_SHM_ALLREDUCE", "1") == "0":
        return None
    if dist.get_backend(group) != "gloo" or not os.path.isdir(SHM_DIR) or not _same_host(group):
        return None
    return SharedTable(world_size, group)


class SharedTable:
    def __init__(self, world_size, group):
        self.world_size = world_size
        self.group = group
        self.rank = dist.get_rank(group)
        self.table = None

    def __call__(self, numel, dtype, device):
        usable = dtype == torch.float32 and torch.device(device).type == "cpu"
        if usable:
            stat = os.statvfs(SHM_DIR)
            usable = stat.f_bavail * stat.f_frsize > 2 * self.world_size * numel * 4  # keep half of it free
        # every rank must agree, or some would wait in a barrier the others never reach
        flag = torch.tensor([1 if usable else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        if not flag.item():
            return torch.zeros(numel, dtype=dtype, device=device)
        name = [os.path.join(SHM_DIR, f"dsfast-grads-{uuid.uuid4().hex}") if self.rank == 0 else None]
        dist.broadcast_object_list(name, src=dist.get_global_rank(self.group, 0) if self.group else 0,
                                   group=self.group)
        path = name[0]
        try:
            ok = torch.tensor([1])
            if self.rank == 0:
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                    try:  # reserve every page now: a full /dev/shm fails here, not with SIGBUS mid-training
                        os.posix_fallocate(fd, 0, self.world_size * numel * 4)
                    finally:
                        os.close(fd)
                except OSError:
                    ok[0] = 0
            dist.broadcast(ok, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)
            if not ok.item():
                return torch.zeros(numel, dtype=dtype, device=device)
            table = torch.from_file(path, shared=True, size=self.world_size * numel, dtype=torch.float32)
            dist.barrier(group=self.group)  # everyone has it mapped: the name can go (no file is ever left behind)
        finally:
            if self.rank == 0 and os.path.exists(path):
                os.unlink(path)
        self.table = table.view(self.world_size, numel)
        self.table[self.rank].zero_()
        return self.table[self.rank]
