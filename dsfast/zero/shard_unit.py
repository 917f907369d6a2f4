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
"""
import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

from .partition import owned_pieces


@dataclass(eq=False)
class ShardUnit:
    plan: object
    slice16: torch.Tensor
    master: torch.Tensor
    shard: torch.nn.Parameter
    host16: Optional[torch.Tensor] = None
    grad: Optional[torch.Tensor] = None
    host_grad: Optional[torch.Tensor] = None

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
    def finish_step(self, mixed, masters_are_params):
        """After an applied update: the 16-bit values onto the device slice (host copies), or, for masters in the
        slice's own dtype (fp32 model, 16-bit masters) kept apart from it, the masters into the slice. `mixed`: the
        masters are fp32 beside a 16-bit model. (A skipped step wrote nothing to copy.)"""
        if mixed:
            if self.host16 is not None:
                self.slice16.copy_(self.host16, non_blocking=True)
        elif not masters_are_params:
            self.slice16.copy_(self.master, non_blocking=True)


class UnitStore:
    """What the two storages of units (flat_shards.FlatShards, stage3.Stage3Store) share: per-unit views and the
    masters -> 16-bit write-back. Needs `units`, `rank` and `masters_are_params`."""
    swap = None         # nvme_states.NvmeStates: the units' masters and states on NVMe
    param_swap = None   # nvme_params.NvmeParams: stage 3's parameter shards on NVMe

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

    def writing16(self, unit):
        """A block that overwrites `unit`'s 16-bit slice: with stage 3's shards on NVMe (param_swap) it is given a
        buffer and written to its file after; otherwise nothing to do."""
        swap = self.param_swap
        return contextlib.nullcontext() if swap is None else swap.holding(unit.slice16, read=False)

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
                with self.writing16(u):
                    u.slice16.copy_(u.master, non_blocking=True)
