"""The NVMe placement of the shard units' fp32 masters and optimizer states (offload_optimizer.device = nvme).

Every unit's master and per-element optimizer states live in one swap file (master first, then the states by
key), except a small unit's (a bias, a norm's weight: at most 1/16 of the largest unit's pages), which stays in host
memory: its file's renames and small write would cost the I/O pool more than its bytes (the host-memory check
counts them). Between steps their tensors keep their objects, shapes and dtypes (optimizer.state[unit.shard] stays
valid) over storages resized to nothing, as engine.offload_states() does. The step walks the units in order through a
window (nvme_window.UnitWindow): a unit's tensors become views of its host buffer while it is stepped, so the
optimizer reads and writes the buffer that goes back to disk (no copy), while the next units are read and the
previous ones written. States the optimizer creates at its first step (in ordinary memory) are packed into the
unit's buffer when it leaves the window. Scalars (the step count) stay in memory.

Checkpoints, dsfast.utils and GatheredParameters' updates reach the states through a Visitor: one unit at a time in
host memory, in the order they ask for them, written back when they change.
"""
import contextlib
import ctypes

import torch
import torch.distributed as dist

from ...comm.where import wait_now
from ...optim.element_wise import element_wise_names, is_element_wise
from .buffers import aligned_size
from .io import SwapError
from .space import SwapSpace
from .window import small_size, small_units_bytes

# The optimizer states per element that the start-up checks budget for (Adam's two moments; SGD needs fewer).
# Buffers are sized from the real states once they exist.
BUDGETED_STATES = 2
_ALIGN = 64   # each tensor of a unit file starts on a cache line


def unit_file_bytes(numel, state_bytes=4 * BUDGETED_STATES):
    """The budgeted bytes of a unit of `numel` elements on disk: its fp32 master and its states, state_bytes per
    element (BUDGETED_STATES fp32 states; 8-bit Adam moments: partition.INT8_MOMENT_BYTES)."""
    return int(numel * (4 + state_bytes))


def window_bytes(largest_numel, buffer_count, state_bytes=4 * BUDGETED_STATES):
    """Host memory of the window: buffer_count buffers, each the size of the largest unit's file."""
    return int(buffer_count) * aligned_size(unit_file_bytes(largest_numel, state_bytes))


def check_unit_by_unit(optimizer, key="offload_optimizer"):
    """The NVMe step runs the optimizer over one unit at a time; refuse one that does not declare itself
    element-wise (optim/element_wise.py: it may read across parameters, as a global norm, a group-level step counter
    or LBFGS's closure do) instead of letting it train differently."""
    if optimizer is None or is_element_wise(optimizer):
        return
    names = ", ".join(element_wise_names())
    raise ValueError(f"zero_optimization.{key}.device \"nvme\" steps the optimizer one unit of parameters at a "
                     f"time, which is exact only for an optimizer whose update of a parameter reads that "
                     f"parameter's state alone; {type(optimizer).__module__}.{type(optimizer).__name__} is not "
                     f"known to be one. Use one of {names} (or the config's optimizer section), give it "
                     f"`_dsfast_element_wise = True` if it is one, or offload to \"cpu\"")


class NvmeStates(SwapSpace):
    def __init__(self, numels, nvme_path, buffer_count, rank, pin=False, threads=2, block_size=1 << 20,
                 key="offload_optimizer"):
        """numels: the elements of every unit's master, to come (the files go under nvme_path, checked first,
        with host memory, before anything is written or allocated). The owner hands each unit over with adopt()
        as soon as its master holds the initial values, so that the masters go to their files one by one (they
        never all exist in memory at once), then calls adopted()."""
        numels = list(numels)
        self.units = []
        files = [unit_file_bytes(n) for n in numels]
        super().__init__(nvme_path, rank, sum(files), buffer_count,
                         window_bytes(max(numels, default=0), buffer_count) + small_units_bytes(files),
                         pin=pin, threads=threads, block_size=block_size, key=key,
                         lower=f"{key}.buffer_count or zero_optimization.reduce_bucket_size (the unit size)")
        self.largest_file = max(files, default=0)
        self.optimizer = None
        self.relayouts = 0     # units whose file layout changed (states appeared) since the last trim
        self.steps = 0         # the engine's optimizer steps so far (shard_step counts them): named in I/O errors

    def adopt(self, unit):
        """`unit`'s master (its initial values) to its file; the master's memory goes with the next write-back. A
        small unit stays in memory (states_swap None: resident, as with offload to the CPU)."""
        unit.master = unit.shard   # one tensor object for the master (the optimizer's parameter)
        if small_size(unit_file_bytes(unit.shard.numel()), self.largest_file):
            return
        unit.states_swap = self
        self.units.append(unit)
        self._evict(unit)

    def adopted(self):
        """Every unit is in its file."""
        self.window.flush()
        give_back_freed_memory()   # the masters' memory, now that they are in their files

    # ---- the step --------------------------------------------------------------------------------------------
    def windows(self, units):
        """Yield each unit in order with its master and states in host memory; read ahead, write behind. Every
        write of the step has landed when the walk ends (an I/O error is raised then)."""
        # one unit stepped, one written, the rest read ahead (the units kept in memory, the small ones, not counted)
        ahead = max(1, self.window.buffer_count - 2)
        swapped = [u.states_swap is self for u in units]
        nxt = 0   # the next unit to read ahead

        def read_ahead(j):   # units after j, until `ahead` swapped ones are being read
            nonlocal nxt
            nxt = max(nxt, j + 1)
            while nxt < len(units) and sum(swapped[j + 1:nxt]) < ahead:
                if swapped[nxt]:
                    self.window.prefetch(units[nxt].index)
                nxt += 1
        try:
            read_ahead(-1)
            for j, u in enumerate(units):
                if swapped[j]:
                    self._load(u)
                yield u
                if swapped[j] and self._evict(u):
                    # its states appeared (the first step): their memory and the copies that moved them are
                    # freed now; given back per unit, else glibc's heap keeps them (its mmap threshold rises to
                    # the size freed) until the walk ends and the first step's peak grows with the units walked
                    give_back_freed_memory()
                read_ahead(j)
        except SwapError:
            with contextlib.suppress(SwapError):   # the writes in flight land before the error goes up
                self.window.flush()
            raise
        self.window.flush()
        # the step's freed memory (states created at a first step, parking) back to the system: glibc keeps
        # freed blocks under its mmap threshold in the heap, and the host would hold more than the window
        self.relayouts = 0
        give_back_freed_memory()
        # (the next step's first units are read during backward, as their gradients land: read_ahead)

    def read_ahead(self, u):
        """u's gradient landed at the accumulation boundary: start reading its master and states, so that the
        step finds them in memory (non-blocking; nothing is read without a free buffer)."""
        if u.states_swap is self:
            self.window.prefetch(u.index)

    def step_order(self, units):
        """`units` with those already in the window (read ahead during backward) first: the step walks them
        before any other is read (an element-wise optimizer: the order changes no value)."""
        ready = [u.states_swap is not self or self.window.state_of(u.index) is not None for u in units]
        return [u for u, r in zip(units, ready) if r] + [u for u, r in zip(units, ready) if not r]

    def visitor(self, writes):
        """A Visitor: one unit at a time in host memory, for code that reads (writes=False) or writes the states of
        units one after another (checkpoints, dsfast.utils, a GatheredParameters update)."""
        self.window.flush()
        return Visitor(self, writes)

    def trim(self):
        """After units took in states created in ordinary memory (the first step, a checkpoint load): that memory,
        freed, goes back to the system (glibc keeps freed blocks under 32 MiB in its heap otherwise)."""
        if self.relayouts:
            self.relayouts = 0
            give_back_freed_memory()

    # ---- internals -------------------------------------------------------------------------------------------
    def _tensors(self, u):
        out = [("master", u.shard)]
        state = self.optimizer.state.get(u.shard, {}) if self.optimizer is not None else {}
        for key in sorted(state):
            v = state[key]
            if torch.is_tensor(v) and key != "step" and v.numel() == u.shard.numel() and v.dim() > 0:
                out.append((key, v))
        return out

    @torch.no_grad()
    def _load(self, u):
        buf = self.window.acquire(u.index)
        storage = buf.tensor.untyped_storage()
        tensors = dict(self._tensors(u))
        for key, offset, numel, dtype in u.states_layout:
            t = tensors.get(key)
            if t is not None:
                t.set_(storage, offset // t.element_size(), t.shape)
        u.states_loaded = True

    def _layout(self, u):
        """((key, byte offset, numel, dtype) per tensor of u's file, file bytes), from u's tensors now."""
        layout, offset = [], 0
        for key, t in self._tensors(u):
            layout.append((key, offset, t.numel(), t.dtype))
            offset = -(-(offset + t.numel() * t.element_size()) // _ALIGN) * _ALIGN
        return tuple(layout), offset

    @torch.no_grad()
    def _evict(self, u):
        """u's master and states to its file (their memory parked); True when the file's layout changed."""
        tensors = self._tensors(u)
        layout, offset = self._layout(u)
        moved = layout != u.states_layout

        def fill(buf):
            for (key, off, numel, dtype), (_, t) in zip(layout, sources):
                view = buf.view(off, numel, dtype)
                if view.data_ptr() != t.data_ptr():
                    view.copy_(t.reshape(-1))
        # a new layout may move bytes within the buffer: copy the sources out first
        sources = [(k, t.clone()) for k, t in tensors] if moved else tensors
        self.relayouts += int(moved and u.states_layout is not None)
        # the step's upload out of the buffer (an fp32 master to the device slice) lands before the buffer is
        # regrown, parked or reused (a visit outside the step comes after the step's uploads landed)
        u.step_event.wait()
        self.window.store(u.index, fill, offset)
        u.states_layout = layout
        self._park_all(u)
        return moved

    def _park_all(self, u):
        for _, t in self._tensors(u):
            park(t)
        u.states_loaded = False


def nvme_states(numels, placement, rank):
    """The NvmeStates for units of `numels` elements where the placement puts the states on NVMe, else None
    (the owner adopts each unit as it makes it)."""
    target = placement.nvme
    if target is None:
        return None
    return NvmeStates(numels, target.path, target.buffer_count, rank, pin=target.pin, threads=target.threads,
                      block_size=target.block_size)


class Visitor:
    """visitor.use(shard): that unit's master and states are in host memory (views of its window buffer) until the
    next use() of another unit or close(), which puts the unit back: written to its file (writes=True, or when
    states appeared) or released unchanged. Views taken of a unit's tensors are valid only until then."""

    def __init__(self, states, writes):
        self.states, self.writes = states, writes
        self.by_shard = {id(u.shard): u for u in states.units}
        self.current = None

    def use(self, shard):
        u = self.by_shard.get(id(shard))
        if u is None or u is self.current:
            return
        self._leave()
        self.states._load(u)
        self.current = u

    def close(self):
        try:
            self._leave()
        finally:
            self.states.window.flush()
            self.states.trim()

    def _leave(self):
        u, self.current = self.current, None
        if u is None:
            return
        states = self.states
        if self.writes or states._layout(u)[0] != u.states_layout:
            states._evict(u)
        else:
            states._park_all(u)
            states.window.discard(u.index)


class NullVisitor:
    """Every state is in memory already (no NVMe): nothing to do."""

    def use(self, shard):
        pass

    def close(self):
        pass


def give_back_freed_memory():
    """malloc_trim(0) where the C library has it (glibc): freed heap memory back to the system."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


@torch.no_grad()
def park(t):
    """t keeps its object, shape and dtype over a storage of no bytes (its values are in the unit's file)."""
    s = torch.UntypedStorage(t.numel() * t.element_size())
    t.set_(s, 0, t.shape)
    s.resize_(0)


@contextlib.contextmanager
def agreed_swap_errors(swaps, world, rank, group=None):
    """Around a step: with swaps (a non-empty list), every rank learns whether any rank's NVMe I/O failed, and
    all raise."""
    error = None
    try:
        yield
    except SwapError as err:
        if not swaps:
            raise
        error = err
    if swaps:
        raise_on_every_rank(error, world, rank, group)


def raise_on_every_rank(error, world, rank, group=None):
    """An NVMe I/O error on any rank stops every rank (none waits in the next collective for a failed one)."""
    if world > 1:
        failed = torch.zeros(world, dtype=torch.int32)
        failed[rank] = int(error is not None)
        wait_now(dist.all_reduce(failed, group=group, async_op=True), ("nvme",))
        if error is None and int(failed.sum()):
            first = int(torch.nonzero(failed)[0])
            raise SwapError(f"rank {first} failed to read or write its NVMe swap files (its own error names the "
                            f"file and the step); rank {rank} stops too")
    if error is not None:
        raise error
