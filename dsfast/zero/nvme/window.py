"""A bounded window of host buffers over the units' swap files (FSDP2's unit-at-a-time shape, on the host).

    window.prefetch(i)        start reading unit i's file into a free buffer (no-op if it is in the window)
    buf = window.acquire(i)   unit i's bytes in host memory (waits for its read); the caller computes on them
    window.release(i, n)      schedule writing the first n bytes back; the buffer is free once the write lands
    buf = window.claim(i, n)  unit i in a buffer without reading it (the caller overwrites it all)

At most `buffer_count` buffers exist, each holding one unit that is being read, used or written, so reading the
next units, the caller's work on this one and writing the previous ones overlap in the I/O pool. A small unit (a
bias or a norm's weight: at most 1/SMALL_SHARE of the largest unit's pages) takes none of them: it gets a buffer of
its own size, freed with its slot (else a model's biases, one unit each at stage 3, would fill half the window).
A write goes into a spare file (a unit's retired version, overwritten in place), which then replaces the unit's
file: a failed write leaves the unit's previous file whole, and the disk's blocks are reused rather than allocated
anew. A buffer is allocated at the size of the largest unit it held (grow() when a unit's bytes grow, e.g. its
optimizer states appear). A read or write error is raised to the caller at the next call that waits on it, or at
flush(). A unit read ahead and never acquired (the caller's order changed) gives its buffer up when one is needed.
"""
import os
from collections import OrderedDict

from .buffers import HostBuffer, aligned_size

FREE, READING, HELD, WRITING = "free", "reading", "held", "writing"
SMALL_SHARE = 16   # a unit at most 1/16 of the largest unit's pages is small: outside the buffer_count buffers


def small_units_bytes(sizes):
    """Host memory the small units among units of `sizes` bytes can hold beside the buffers (all of them at once,
    their writes in flight)."""
    largest = max(sizes, default=0)
    return sum(aligned_size(n) for n in sizes if small_size(n, largest))


def small_size(nbytes, largest):
    """A unit of `nbytes` is small beside one of `largest` (in whole pages: a unit under a page is small only
    beside units of SMALL_SHARE pages or more)."""
    return 0 < nbytes and aligned_size(nbytes) * SMALL_SHARE <= aligned_size(largest)


class _Slot:
    def __init__(self, small=False):
        self.buffer, self.unit, self.state, self.future, self.spare = None, None, FREE, None, None
        self.small = small   # a small unit's slot: its buffer at the unit's size, gone when the slot frees


class UnitWindow:
    def __init__(self, io, swap_dir, buffer_count, pin=False, name="unit{}.swap"):
        """io: nvme_io.SwapIO; swap_dir: nvme_files.SwapDir; the files are swap_dir.file(name.format(i))."""
        if int(buffer_count) < 1:
            raise ValueError(f"buffer_count={buffer_count!r}: NVMe offload needs at least 1 host buffer")
        self.io, self.dir, self.pin, self.name = io, swap_dir, pin, name
        self.buffer_count = int(buffer_count)
        self.sizes = {}           # unit -> bytes in its file (written at least once)
        self._slots = [_Slot() for _ in range(self.buffer_count)]
        self._small = []          # the small units' slots in use
        self._where = {}          # unit -> its slot while in the window
        self._writes = OrderedDict()   # id(slot) -> slot, oldest write first
        self._reads = OrderedDict()    # id(slot) -> slot read ahead and not acquired yet, oldest first
        self._spares = []         # files no unit needs (retired versions): the next writes overwrite them
        self.spare_files = 0      # at most one per write in flight, so at most buffer_count
        self.step = None          # named in I/O errors (the caller sets it)
        self.peak_in_use = 0

    # ---- accounting ------------------------------------------------------------------------------------------
    @property
    def in_use(self):
        """The buffer_count buffers in use (small units' slots left out)."""
        return sum(s.state != FREE for s in self._slots)

    def buffers(self):
        """The host buffers allocated now (nvme_buffers.HostBuffer)."""
        return [s.buffer for s in self._slots + self._small if s.buffer is not None]

    def is_small(self, i):
        """Unit i is small: it takes no buffer of the buffer_count (SMALL_SHARE)."""
        return self._small_bytes(self.sizes.get(i, 0))

    def _small_bytes(self, nbytes):
        return small_size(nbytes, max(self.sizes.values(), default=0))

    def path(self, i):
        return self.dir.file(self.name.format(i))

    def state_of(self, i):
        s = self._where.get(i)
        return s.state if s is not None else None

    # ---- the protocol ----------------------------------------------------------------------------------------
    def prefetch(self, i, wait=False):
        """Start reading unit i (True when it is in the window now). Without a free buffer it waits for the oldest
        write-back; with every buffer held by the caller it reads nothing (wait=False) or raises (wait=True)."""
        if i in self._where:
            return True
        if i not in self.sizes:
            raise KeyError(f"unit {i} has no swap file yet (store it first)")
        slot = self._small_slot() if self.is_small(i) else self._free_slot(required=wait)
        if slot is None:
            return False
        self._fit(slot, self.sizes[i], keep=0)
        slot.unit, slot.state = i, READING
        slot.future = self.io.read(self.path(i), slot.buffer, self.sizes[i], step=self.step)
        self._reads[id(slot)] = slot
        self._where[i] = slot
        self._count()
        return True

    def acquire(self, i):
        """Unit i's buffer (nvme_buffers.HostBuffer), its bytes read (or still there from its last release)."""
        self.prefetch(i, wait=True)
        slot = self._where[i]
        if slot.state == WRITING:   # released and wanted again: its bytes are current once the write lands
            self._writes.pop(id(slot), None)
        self._reads.pop(id(slot), None)
        if slot.future is not None:
            future, slot.future = slot.future, None
            self._settle(slot, future)
        if slot.spare is not None:
            self._spares.append(slot.spare)
            slot.spare = None
        slot.state = HELD
        return slot.buffer

    def grow(self, i, nbytes):
        """Unit i (held) needs `nbytes`: its buffer, reallocated at that size if smaller (contents kept)."""
        slot = self._held(i, "grow")
        self._fit(slot, nbytes, keep=min(slot.buffer.nbytes, aligned_size(nbytes)))
        return slot.buffer

    def release(self, i, nbytes):
        """Write the first `nbytes` of unit i's buffer back to its file (in the background)."""
        slot = self._held(i, "release")
        if nbytes > slot.buffer.nbytes:
            raise ValueError(f"unit {i}: release of {nbytes} bytes from a buffer of {slot.buffer.nbytes} (grow it)")
        slot.state = WRITING
        if not self._spares:   # a name for one more spare (the write creates it)
            self._spares.append(self.dir.file(f"spare{self.spare_files}.swap"))
            self.spare_files += 1
        slot.spare = self._spares.pop()
        slot.future = self.io.write(self.path(i), slot.buffer, nbytes, step=self.step, spare=slot.spare)
        self._writes[id(slot)] = slot
        self.sizes[i] = nbytes

    def discard(self, i):
        """Give unit i's buffer back without writing (its file keeps the previous bytes)."""
        slot = self._held(i, "discard")
        self._free(slot)

    def forget(self, i):
        """Unit i is gone: its buffer (once a write in flight landed) and its file."""
        if i in self._where:
            self.acquire(i)
            self.discard(i)
        if self.sizes.pop(i, None) is not None:
            os.unlink(self.path(i))

    def store(self, i, fill, nbytes):
        """Create or replace unit i's file: fill(buffer) writes its `nbytes` (initial values, a checkpoint load)."""
        fill(self.claim(i, nbytes))
        self.release(i, nbytes)

    def claim(self, i, nbytes):
        """Unit i held in a buffer of at least `nbytes` without reading its file: the caller writes all of it
        (release() writes it back, discard() leaves the file as it was)."""
        if i in self._where and self._where[i].state != HELD:
            self.acquire(i)
        if i not in self._where:
            slot = self._small_slot() if self._small_bytes(nbytes) else self._free_slot(required=True)
            self._fit(slot, nbytes, keep=0)
            slot.unit, slot.state = i, HELD
            self._where[i] = slot
            self._count()
        return self.grow(i, nbytes)

    def flush(self):
        """Every write-back landed (then the first I/O error is raised); buffers stay allocated, prefetched units
        read."""
        first = None
        for slot in list(self._writes.values()):
            try:
                self._finish_write(slot)
            except Exception as err:   # the other writes still land (nothing left running behind an error)
                first = first or err
        if first is not None:
            raise first

    def close(self):
        """Flush, then free every buffer (reads in flight land first)."""
        try:
            self.flush()
        finally:
            for slot in self._slots + self._small:
                if slot.future is not None:
                    slot.future.exception()   # wait, without raising: the buffers go either way
                if slot.buffer is not None:
                    slot.buffer.free()
                slot.__init__()
            self._small = []
            self._where.clear()
            self._writes.clear()
            self._reads.clear()

    # ---- internals -------------------------------------------------------------------------------------------
    def _held(self, i, what):
        slot = self._where.get(i)
        if slot is None or slot.state != HELD:
            raise RuntimeError(f"UnitWindow.{what}({i}): unit {i} is not acquired "
                               f"(state: {slot.state if slot else 'not in the window'})")
        return slot

    def _small_slot(self):
        slot = _Slot(small=True)
        self._small.append(slot)
        return slot

    def _free_slot(self, required):
        for slot in self._slots:
            if slot.state == FREE:
                return slot
        writes = [w for w in self._writes.values() if not w.small]
        if writes:   # the oldest write-back frees its buffer
            slot = writes[0]
            self._finish_write(slot)
            return slot
        reads = [r for r in self._reads.values() if not r.small]
        if required and reads:   # a read ahead nobody acquired (the caller's order changed): dropped
            slot = self._reads.pop(id(reads[0]))
            future, slot.future = slot.future, None
            future.exception()   # waited for; its error, if any, no longer matters
            self._free(slot)
            return slot
        if required:
            raise RuntimeError(f"the NVMe window is full: all {self.buffer_count} host buffers hold units being "
                               "stepped; release one first or raise buffer_count")
        return None

    def _finish_write(self, slot):
        self._writes.pop(id(slot), None)
        future, slot.future = slot.future, None
        try:
            self._settle(slot, future)
        finally:
            self._free(slot)

    def _settle(self, slot, future):
        try:
            future.result()
        except BaseException:
            self._free(slot)   # a failed read holds nothing; a failed write's bytes are the caller's error now
            raise

    def _free(self, slot):
        if slot.spare is not None:   # a write settled: its spare file (the retired version) serves the next
            self._spares.append(slot.spare)
            slot.spare = None
        self._reads.pop(id(slot), None)
        self._where.pop(slot.unit, None)
        slot.unit, slot.state, slot.future = None, FREE, None
        if slot.small:   # (its buffer was the unit's size: the next small unit gets one of its own)
            if slot.buffer is not None:
                slot.buffer.free()
                slot.buffer = None
            self._small = [s for s in self._small if s is not slot]

    def _fit(self, slot, nbytes, keep):
        if slot.buffer is not None and slot.buffer.nbytes >= aligned_size(nbytes):
            return
        # the size of the largest unit: a buffer then fits any unit, and buffers are not reallocated per unit
        fresh = HostBuffer(nbytes if slot.small else max([nbytes] + list(self.sizes.values())), pin=self.pin)
        if keep:
            fresh.tensor[:keep].copy_(slot.buffer.tensor[:keep])
        if slot.buffer is not None:
            slot.buffer.free()
        slot.buffer = fresh

    def _count(self):
        n = self.in_use
        assert n <= self.buffer_count, f"NVMe window holds {n} units, more than buffer_count={self.buffer_count}"
        self.peak_in_use = max(self.peak_in_use, n)
