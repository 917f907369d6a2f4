"""A shard unit: everything one bucket keeps on this rank at ZeRO stages 1-3, in one object (FSDP2's FSDPParam at
bucket size; at stage 3 a bucket is one parameter). The storage (flat_shards.FlatShards, stage3.Stage3Store) makes
the units; the owner's reduction fills in their gradients; the step applies the optimizer to them.

    plan       the bucket's layout (partition.BucketPlan): its parameters, padding, param group, this rank's range
    slice16    this rank's slice of the bucket in the model's dtype (what the all-gather publishes)
    master     the master of that slice, in the precision policy's master dtype (fp32, or the model's 16-bit dtype);
               the slice itself when it is in the slice's dtype and the placement allows
    shard      the torch.nn.Parameter over `master` the optimizer steps: optimizer.state[shard] is the unit's state
    host16     offload to a distinct host: the host copy the CPU optimizer writes 16-bit values into
    grad       the reduced gradient slice (the precision policy's reduce dtype)
    host_grad  offload to a distinct host: its host copy, made as the reduction completes (or at step time)

Residency (where the unit's bytes live between uses) and readiness (whether they are in memory now):
    states_swap     offload_optimizer on NVMe: the nvme_states.NvmeStates whose file holds master and states
                    (None: they live in memory)
    states_layout   that file's layout, ((key, byte offset, numel, dtype), ...) (None: not written yet)
    states_loaded   master and states are in host memory (always, without states_swap)
    param_swap      stage 3 with offload_param on NVMe: the nvme_params.NvmeParams whose file holds slice16
                    (None: slice16 lives in memory, max_in_cpu's shards included)
The step's walk (shard_step.py) and the NVMe placements ask the unit these, not a table of their own.
    grad_event      the unit's gradient is where the step reads it (its host copy landed): an event of a lane
                    (accelerator/streams.py); a DoneEvent where no copy is in flight
    step_event      the unit's step is complete (updated, its 16-bit values back where the forward reads them)
"""
import contextlib
from dataclasses import dataclass, field
from typing import Optional

import torch

from ...accelerator.streams import DoneEvent, Lanes

from ..policy.partition import owned_pieces


def copy_on_lane(lane, dst, src, what):
    """dst.copy_(src) queued on `lane`; returns its event. Outside autograd: the caller's no_grad does not follow
    into a lane's worker thread."""
    def copy():
        with torch.no_grad():
            dst.copy_(src, non_blocking=True)
    return lane.submit(copy, what)


@dataclass(eq=False)
class ShardUnit:
    plan: object
    slice16: torch.Tensor
    master: torch.Tensor
    shard: torch.nn.Parameter
    host16: Optional[torch.Tensor] = None
    grad: Optional[torch.Tensor] = None
    host_grad: Optional[torch.Tensor] = None
    states_swap: Optional[object] = None
    states_layout: Optional[tuple] = None
    states_loaded: bool = True
    param_swap: Optional[object] = None
    grad_event: object = field(default_factory=DoneEvent)
    step_event: object = field(default_factory=DoneEvent)

    @property
    def resident(self):
        """Everything the step touches lives in memory (no NVMe file behind the states or the 16-bit slice)."""
        return self.states_swap is None and self.param_swap is None

    def writing16(self):
        """A block that overwrites the 16-bit slice: on NVMe it is given a buffer (nothing read: the block writes
        all of it) and written to its file after; in memory, nothing to do."""
        if self.param_swap is None:
            return contextlib.nullcontext()
        return self.param_swap.holding(self.slice16, read=False)

    @property
    def index(self):
        return self.plan.index

    @property
    def out16(self):
        """Where the optimizer writes the updated 16-bit values."""
        return self.host16 if self.host16 is not None else self.slice16

    @property
    def update_grad(self):
        """The gradient the optimizer reads (the host copy where there is one)."""
        return self.host_grad if self.host_grad is not None else self.grad

    @torch.no_grad()
    def finish_step(self, mixed, masters_are_params, lane=None):
        """After an applied update: the 16-bit values onto the device slice (host copies), or, for masters in the
        slice's own dtype (fp32 model, 16-bit masters) kept apart from it, the masters into the slice. `mixed`: the
        masters are fp32 beside a 16-bit model. (A skipped step wrote nothing to copy.) lane: the h2d lane where
        the slice is device memory apart from the host (UnitStore.upload_lane): the copy is queued there; None:
        copied here. Returns the copy's event (the caller decides who waits for it: apply.py)."""
        if mixed:
            src = self.host16
        else:
            src = None if masters_are_params else self.master
        if src is None:
            return DoneEvent()
        dst = self.slice16
        if lane is None:
            dst.copy_(src, non_blocking=True)
            return DoneEvent()
        return copy_on_lane(lane, dst, src, f"updated 16-bit values of unit {self.index} to the device")


class UnitStore:
    """What the two storages of units (flat_shards.FlatShards, stage3.Stage3Store) share: per-unit views and the
    masters -> 16-bit write-back. Needs `units`, `rank` and `masters_are_params`."""
    swap = None         # nvme_states.NvmeStates where the states are on NVMe (the storages set it)
    slices_on_device = True   # the 16-bit slices are device memory (stage 3 with offload_param: host memory)
    param_swap = None   # stage 3: nvme_params.NvmeParams where the shards are on NVMe
    _lanes = None

    @property
    def lanes(self):
        """The lanes (accelerator/streams.py) of this storage's copies and host step, made on first use: CUDA
        streams on a GPU, worker threads on CPU ranks under the test placement (distinct host), else inline."""
        if self._lanes is None:
            self._lanes = Lanes(self.placement.device, emulate=self.placement.distinct)
        return self._lanes

    def close_lanes(self):
        """The lanes' work done and their threads stopped (the owner's detach: engine.destroy())."""
        if self._lanes is not None:
            self._lanes.close()

    def upload_lane(self):
        """The h2d lane the updated 16-bit values go to the device on: offload to a distinct host, with the 16-bit
        slices in device memory (`slices_on_device`, the storages set it); None where the slice is host memory
        (stage 3's offload_param: the optimizer's values are written there directly)."""
        if not (self.placement.copies_states and self.slices_on_device):
            return None
        return self.lanes.device_lane("h2d")

    def wait_uploads(self):
        """Every unit's upload of its updated 16-bit values has landed (raises a failed copy's error)."""
        for u in self.units:
            u.step_event.wait()

    @property
    def masters(self):
        return [u.master for u in self.units]

    @property
    def shards(self):
        return [u.shard for u in self.units]

    @property
    def host16(self):
        return [u.host16 for u in self.units]

    @property
    def grads(self):
        return [u.grad for u in self.units]

    def pieces(self, plan):
        return owned_pieces(plan, self.rank)

    @torch.no_grad()
    def write_back(self, use=None):
        """Masters -> this rank's 16-bit slices (after a checkpoint load: the optimizer did not write them).
        use(shard): brings a unit's master into memory first (NVMe: the owner's visiting, state_owner.OwnerDefaults)."""
        if not self.masters_are_params:
            for u in self.units:
                if use is not None:
                    use(u.shard)
                with u.writing16():
                    u.slice16.copy_(u.master, non_blocking=True)
