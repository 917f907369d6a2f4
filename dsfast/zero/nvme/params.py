"""The NVMe placement of ZeRO stage 3's parameter shards (offload_param.device = nvme).

Each partitioned parameter's shard (this rank's slice, in the model dtype) lives in its own swap file; between
uses `rec.shard` keeps its object, shape and dtype over a storage of no bytes, as the swapped states do
(nvme_states.py), so the owner's units and `param.ds_tensor` stay the same tensors. Who reads and writes them:
  gathers     `copy_of(rec)`: the shard read through the window into a private copy that the all-gather sends
              (the buffer goes back at once, so a module with more parameters than buffers still gathers). Reads
              follow the order of the previous step's (forward, backward, the gathers after the step): while one
              shard is copied, the next buffer_count - 1 are being read.
  the step    `holding(shard, read=False)`: a buffer the optimizer writes the new 16-bit values into, written
              back behind the next units' step (nothing read: the step overwrites all of it)
  the rest    checkpoints, GatheredParameters' updates, the write-back after a load: `holding` one at a time
With offload_optimizer.overlap_step the step's writes run in a worker thread while the next forward's gathers
read on the main thread: every window call is made under `lock` (never while a `holding` block runs, and never
while waiting on the other thread: the I/O pool, the only thing waited for under it, never takes it). A unit read
ahead before the worker overwrote it stays consistent by the window's one slot per unit: the worker's claim takes
the slot over (its read landed first) and a gather after the unit's step finds the new bytes. A failed write of
the step met by a gather is handed to `write_failed` (the overlapped step's failure, raised at its settle on every
rank) instead of being raised in one rank's forward.
Up to offload_param.max_in_cpu elements of shards stay in host memory instead (persistent parameters first:
they are gathered after every step). Gathers go through collectives, never a /dev/shm snapshot of every shard
(which would hold the whole model in host memory again).
"""
import contextlib
import logging
import threading
from functools import partial

import torch

from .buffers import aligned_size
from .io import SwapError
from .space import SwapSpace
from .states import park, give_back_freed_memory
from .window import HELD, small_units_bytes

KEY = "offload_param"
logger = logging.getLogger("dsfast.zero.nvme")


def shard_bytes(rec):
    return rec.shard_numel * rec.shard.element_size()


class NvmeParams(SwapSpace):
    def __init__(self, records, target, rank, keep=(), synchronize=None):
        """records: every partitioned parameter (shards in host memory, in the model dtype); target: the
        placement's nvme_params (placement.NvmeTarget); keep: records to keep in memory first (persistent)."""
        self.resident, self.records = _split(records, keep, target.max_in_cpu)
        self.buffer_count = int(target.buffer_count)
        largest = max((shard_bytes(r) for r in self.records), default=0)
        files = [shard_bytes(r) for r in self.records]
        super().__init__(target.path, rank, sum(aligned_size(n) for n in files), self.buffer_count,
                         self.buffer_count * aligned_size(largest) + small_units_bytes(files), pin=target.pin,
                         threads=target.threads, block_size=target.block_size, key=KEY, name="param{}.swap",
                         lower=f"{KEY}.buffer_count or the largest parameter (its shard is a buffer's size)")
        largest_numel = max((r.shard_numel for r in self.records), default=0)
        if target.buffer_size and largest_numel > target.buffer_size:
            logger.warning(f"{KEY}.buffer_size={target.buffer_size} is below the largest parameter shard "
                           f"({largest_numel} elements): the swap buffers are allocated at that size instead")
        self.synchronize = synchronize or (lambda: None)
        self.lock = threading.RLock()   # around every window call (the overlapped step's worker writes too)
        self.write_failed = None   # overlap_step, while a step's writes may be in flight: takes their errors
        self.index = {}            # id(rec.shard) -> the number of its file
        self.steps = 0             # the engine's optimizer steps so far: named in I/O errors
        self.trace, self.seen, self.follow = [], [], False   # the order of the gathers' reads (read-ahead)
        swapped, self.records = self.records, []
        for r in swapped:
            self.add(r)
        self.flush()
        give_back_freed_memory()

    # ---- which shards are swapped ----------------------------------------------------------------------------
    @torch.no_grad()
    def add(self, rec):
        """rec's shard (in memory) to a file of its own; its memory goes with the write-back."""
        i = len(self.index)
        self.records.append(rec)
        self.index[id(rec.shard)] = i
        rec.swap = self
        with self.lock:
            self.window.store(i, lambda buf: buf.view(0, rec.shard_numel, rec.dtype).copy_(rec.shard),
                              shard_bytes(rec))
        park(rec.shard)

    @torch.no_grad()
    def recast(self, rec, values):
        """rec's shard becomes `values` (its shard's elements, in another dtype: the 16-bit cast at initialize
        of a parameter zero.Init put on NVMe): a new shard tensor, written to the same file number."""
        i = self.index.pop(id(rec.shard))
        rec.dtype = values.dtype
        rec.shard = torch.empty(rec.shard_numel, dtype=values.dtype, device=rec.shard_device)
        self.index[id(rec.shard)] = i
        with self.lock:
            self.window.store(i, lambda buf: buf.view(0, rec.shard_numel, rec.dtype).copy_(values),
                              shard_bytes(rec))
        park(rec.shard)
        rec.full = None
        rec.param.data = rec._empty()

    @torch.no_grad()
    def bring_back(self, rec):
        """rec's shard back in memory for good (max_in_cpu, or a run without NVMe); its file goes."""
        values = self.copy_of(rec, trace=False)
        i = self.index.pop(id(rec.shard))
        self.records.remove(rec)
        rec.shard.set_(values)
        rec.swap = None
        with self.lock:
            self.window.forget(i)

    def train(self, records, keep, max_in_cpu):
        """The shards zero.Init swapped, taken over for training: max_in_cpu elements of `records` (`keep`
        first) in memory, every other one in its file."""
        resident, swapped = _split(records, keep, max_in_cpu)
        for r in resident:
            if r.swap is self:
                self.bring_back(r)
        for r in swapped:
            if r.swap is None:
                self.add(r)
        self.resident = resident
        self.seen = []   # construction's reads are no order to read ahead in
        self.flush()
        give_back_freed_memory()

    def backs(self, shard):
        """Whether `shard` (a record's) lives in a file of this swap (not kept in memory by max_in_cpu)."""
        return id(shard) in self.index

    # ---- gathers ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def copy_of(self, rec, trace=True):
        """rec's shard values in a tensor of their own (read through the window; the buffer is given back).
        trace=False: a read outside the training passes (a checkpoint), not part of the order read ahead in."""
        i = self.index[id(rec.shard)]
        with self.lock:
            if self.window.state_of(i) == HELD:   # (a gather waits its unit's step: partitioned_param._await_step)
                raise RuntimeError(f"parameter shard file {i} ({self.window.path(i)}) is held by the optimizer step "
                                   "while a gather reads it: the gather must wait for the unit's step first")
            if trace:
                self._read_ahead(i)
            buf = self._deferring_write_errors(partial(self.window.acquire, i))
            out = buf.view(0, rec.shard_numel, rec.dtype).clone()
            self.window.discard(i)
        return out

    def _deferring_write_errors(self, call):
        """call() (a window call of a gather); a failed write-back it meets while write_failed is set goes there
        and the call is made again (the failed write freed its buffer; the unit's file is its previous version)."""
        while True:
            try:
                return call()
            except SwapError as err:
                if self.write_failed is None or not getattr(err, "write", False):
                    raise
                self.write_failed(err)

    def _read_ahead(self, i):
        k = len(self.seen)
        self.seen.append(i)
        if self.follow and k < len(self.trace) and self.trace[k] == i:
            for j in self.trace[k + 1:k + self.buffer_count]:
                if not self._deferring_write_errors(partial(self.window.prefetch, j)):
                    break
        else:
            self.follow = False   # off the last pass's order (an eval forward): no guessing until the next step

    def new_pass(self, read=True):
        """After a step: this pass's reads are the order to read ahead in next time; its first ones start now
        (read=False: not yet, the overlapped step is about to overwrite them; the gathers read ahead)."""
        self.trace, self.seen = self.seen, []
        self.follow = bool(self.trace)
        if not read:
            return
        with self.lock:
            for j in self.trace[:self.buffer_count - 1]:
                self._deferring_write_errors(partial(self.window.prefetch, j))

    # ---- writers ---------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def holding(self, shard, read=True, write=True):
        """`shard` (a record's) in host memory for the block: read from its file (read=False: the block writes
        all of it) and written back after (write=False: left as its file has it). A resident shard: as it is."""
        i = self.index.get(id(shard))
        if i is None:
            yield shard
            return
        with self.lock:   # (not held while the block runs: the other thread's gathers go on meanwhile)
            buf = self.window.acquire(i) if read else self.window.claim(i, shard.numel() * shard.element_size())
        shard.set_(buf.tensor.untyped_storage(), 0, shard.shape)
        done = False
        try:
            yield shard
            done = True
        finally:
            self.synchronize()   # a device's copies into or out of the buffer land before it is reused
            park(shard)
            with self.lock:
                if write and done:
                    self.window.release(i, shard.numel() * shard.element_size())
                else:
                    self.window.discard(i)

    def flush(self):
        """Every write-back landed (the first I/O error is raised)."""
        with self.lock:
            self.window.flush()

    def host_buffers(self):
        with self.lock:
            return super().host_buffers()

    def close(self):
        with self.lock:
            super().close()


def _split(records, keep, max_in_cpu):
    """(resident, swapped): shards kept in memory while their elements total at most max_in_cpu, `keep` first."""
    kept = {id(r) for r in keep}
    order = [r for r in records if id(r) in kept] + [r for r in records if id(r) not in kept]
    resident, total = set(), 0
    for r in order:
        if total + r.shard_numel <= max_in_cpu:
            resident.add(id(r))
            total += r.shard_numel
    return ([r for r in records if id(r) in resident], [r for r in records if id(r) not in resident])


def nvme_params(records, placement, rank, keep=()):
    """The NvmeParams of stage 3's `records` where the placement puts the parameters on NVMe, else None. Shards
    zero.Init already put in swap files stay there: that swap is taken over. (A run without parameters on NVMe
    brought them back to memory first: stage3.build_stage3_owner.)"""
    target = placement.nvme_params
    if target is None:
        return None
    built = next((r.swap for r in records if r.swap is not None), None)
    if built is not None:
        built.synchronize = placement.synchronize
        built.train(records, keep, target.max_in_cpu)
        return built
    return NvmeParams(records, target, rank, keep=keep, synchronize=placement.synchronize)


def construction_swap(target, rank):
    """zero.Init's swap for the shards it makes (placement.NvmeTarget from its config): each shard goes to its
    file as soon as its parameter is partitioned; initialize() takes the swap over (nvme_params)."""
    return NvmeParams([], target, rank)
