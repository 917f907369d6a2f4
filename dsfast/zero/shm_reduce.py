"""Stage-0 gradient all-reduce through shared memory, for ranks that share one machine (CPU training on gloo).

gloo all-reduces over TCP even between processes on one host: every byte crosses the kernel twice and a gloo
thread per rank spends ~10 ms of CPU per step on the benchmark GPT. Here the gradient buckets themselves live in
one /dev/shm table of shape [world, numel] (row r = rank r's gradients), so reducing a bucket is:
    barrier (every rank finished writing the bucket) -> rank r sums column chunk r over all rows and writes the
    sum back into chunk r of every row -> (the next bucket's barrier, or the final one) -> every row holds the sum.
Chunks are disjoint, so ranks never write what another rank reads. Only gloo barriers cross process boundaries.

Used when: gloo backend, every rank on this host, all buckets fp32 on CPU, /dev/shm has room, and
DSFAST_SHM_ALLREDUCE is not "0". Anything else keeps the gloo all-reduce (grad_sync.AllReduceGradSync).
"""
import os
import socket
import uuid

import torch
import torch.distributed as dist

from .grad_sync import AllReduceGradSync

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


class ShmBucketReduce:
    """The same-host reduction of stages 0 and 1, mixed into their gradient sync (synchronously, in the hook): the
    buckets are this rank's row of the table; reducing one is a barrier (every rank finished writing it, and
    reducing the previous one), then this rank sums its `chunk` of columns over every row, into every row (stage
    0: an all-reduce) or only into its own (stage 1: a reduce-scatter, half the writes). A last barrier at the end
    of backward: no rank still reads a row its owner writes or zeroes next."""

    scatter = False

    def _chunk(self, bucket):
        """This rank's columns of `bucket` in the table (stage 0: a 1/world share of it)."""
        n = bucket.flat.numel()
        return bucket.offset + n * self.rank // self.world_size, bucket.offset + n * (self.rank + 1) // self.world_size

    def _launch(self, bucket):
        dist.barrier(group=self.group)
        lo, hi = self._chunk(bucket)
        if hi > lo:
            cols = self.table[:, lo:hi]
            total = cols.sum(dim=0)   # (a sum into a row would alias its input)
            if self.scatter:
                self.table[self.rank, lo:hi].copy_(total)
            else:
                cols.copy_(total.expand_as(cols))
        bucket.handle = _DONE
        self._next += 1
        self.collectives_launched += 1

    def end_backward(self):
        reduced = self._reduce
        super().end_backward()  # launches what is left (through _launch) and clears the handles
        if reduced:
            dist.barrier(group=self.group)


class ShmAllReduceGradSync(ShmBucketReduce, AllReduceGradSync):
    """Stage 0: AllReduceGradSync whose bucket reduction runs through the shared table."""

    def __init__(self, buffers, world_size, table, group=None):
        super().__init__(buffers, world_size, group)
        self.table = table
        self.rank = dist.get_rank(group)


class _Done:
    def wait(self):
        pass


_DONE = _Done()
