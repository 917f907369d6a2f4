"""Stage 0's state owner: every rank holds everything (plain data parallelism).

It owns the precision strategy (mixed_precision.py: fp32 masters and flat gradient buckets) and the bucketed
all-reduce (grad_sync.py / shm_reduce.py), and does the step: one unscale + clip + overflow pass then the
optimizer, or, for FusedAdam/FusedSGD, the same on the device without host syncs (device_step.py).
"""
import torch

from .device_step import queue_device_step, takes_device_scalars
from .mixed_precision import finalize_grads
from .state_owner import SliceRecord


class Replicated:
    stage = 0

    def __init__(self, precision, grad_sync):
        self.precision = precision
        self.grad_sync = grad_sync
        self.buffers = precision.buffers
        self._optimizer = None
        for p in precision.params:
            p._dsfast_owner = self

    @property
    def post_reduce_factor(self):
        return self.grad_sync.post_reduce_factor

    def bind_optimizer(self, optimizer):
        self._optimizer = optimizer

    def begin_backward(self, reduce):
        self.grad_sync.begin_backward(reduce)

    def end_backward(self):
        self.grad_sync.end_backward()

    def prepare_step(self, names):
        self.grad_sync.prepare_step(names)

    def step(self, optimizer, factor, clip, check_overflow):
        flats = self.buffers.flats()
        if takes_device_scalars(optimizer):
            # FusedAdam/FusedSGD: flag, norm and clip coefficient stay on the device and the kernel skips by
            # itself; the flag is read once, after the update is queued (device_step.py says why it must be).
            found_inf, norm = queue_device_step(self.precision, optimizer, flats, factor, clip, check_overflow)
            return found_inf is None or not bool(found_inf), norm
        applied, norm = finalize_grads(flats, factor, clip, check_overflow)
        if applied:
            self.precision.optimizer_step(optimizer)
        return applied, norm

    def zero_grads(self):
        self.buffers.zero()
        self.grad_sync.reset()

    def detach(self):
        self.grad_sync.detach()

    # ---- checkpoints and dsfast.utils: every rank holds whole parameters ------------------------------------
    def checkpoint_layout(self, names):
        return [SliceRecord(names[id(p)], tuple(p.shape), 0, p.numel(), self.precision.master_of(p), 0)
                for p in self.precision.params]

    @torch.no_grad()
    def after_checkpoint_load(self):
        if self.precision.params and self.precision.masters is not self.precision.params:   # none: nothing trains
            torch._foreach_copy_(self.precision.params, self.precision.masters)

    def full_fp32_param(self, param):
        return self.precision.master_of(param).detach().float().clone()

    def full_grad(self, param):
        return self.buffers.view_of(param).float() * self.post_reduce_factor

    def full_optimizer_state(self, param, key):
        state = self._optimizer.state.get(self.precision.master_of(param), {}) if self._optimizer else {}
        if key not in state:
            raise KeyError(f"optimizer state {key!r} does not exist (yet): available keys {sorted(state)}; "
                           "states appear after the first optimizer step")
        return state[key].float().clone()

    local_fp32_param = full_fp32_param
    local_grad = full_grad
    local_optimizer_state = full_optimizer_state

    def memory_tensors(self):
        prec = self.precision
        cats = {"params": [p.data for p in prec.params],
                "masters": list(prec.masters) if prec.masters is not prec.params else [],
                "grads": self.buffers.flats(), "optimizer_states": [], "comm_buffers": []}
        if self._optimizer is not None:
            for m in prec.masters:
                cats["optimizer_states"] += [t for t in self._optimizer.state.get(m, {}).values()
                                             if torch.is_tensor(t) and t.numel() > 1]
        return cats
