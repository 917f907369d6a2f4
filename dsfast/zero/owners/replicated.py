"""Stage 0's state owner: every rank holds everything (plain data parallelism).

It owns the master copies (mixed_precision.py: fp32 masters and flat gradient buckets) and the bucketed
all-reduce (grad_sync.py over the one reduction, reducer.py), and steps as every stage does: zero/step/decide.py
decides overflow, norm and
clip coefficient over the reduced buckets, then the optimizer applies them inside its update (optim/amp_step.py).
"""
import torch

from ...optim.amp_step import amp_step
from ..step.decide import decide
from .set_values import checked_value
from ..owner import OwnerDefaults, SliceRecord


def _what(param):
    return f"parameter of shape {tuple(param.shape)}"


class Replicated(OwnerDefaults):
    stage = 0

    def __init__(self, policy, copies, grad_sync):
        """policy: the precision.PrecisionPolicy; copies: its mixed_precision master copies."""
        self.precision = policy
        self.copies = copies
        self.grad_sync = grad_sync
        self.reducer = grad_sync.reducer
        self.buffers = copies.buffers
        self._optimizer = None
        for p in copies.params:
            p._dsfast_owner = self

    @property
    def post_reduce_factor(self):
        return self.grad_sync.post_reduce_factor

    def bind_optimizer(self, optimizer):
        self._optimizer = optimizer

    # ---- what the optimizer steps: the fp32 masters (the parameters themselves in fp32) ----------------------
    @property
    def trains(self):
        return bool(self.copies.params)

    optimizer_device = None   # the engine's device

    def optimizer_groups(self, groups):
        master_of = self.copies.master_of
        if groups and isinstance(groups[0], dict):
            return [{**g, "params": [master_of(p) for p in g["params"] if p.requires_grad]} for g in groups]
        return [master_of(p) for p in groups if p.requires_grad]

    def adopt_client_optimizer(self, optimizer, groups):
        """A client optimizer built on the model's params steps their fp32 masters (its state moves too)."""
        copies = self.copies
        if copies.masters is copies.params:
            return
        for g in optimizer.param_groups:
            g["params"] = [copies.master_of(p) for p in g["params"]]
        old_state = dict(optimizer.state)
        optimizer.state.clear()
        for p, s in old_state.items():
            optimizer.state[copies.master_of(p)] = s

    def begin_backward(self, reduce):
        self.grad_sync.begin_backward(reduce)

    def end_backward(self):
        self.grad_sync.end_backward()

    def prepare_step(self, names):
        self.grad_sync.prepare_step(names)

    def step(self, optimizer, factor, clip, check_overflow):
        """(applied, norm): the buckets are all-reduced already, so the decision needs no collective."""
        pieces = [(0, self.buffers.view_of(p)) for p in self.copies.params]   # DeepSpeed's per-param norms
        decision = decide(self.buffers.flats(), factor, clip, check_overflow, pieces=pieces, stage=0)
        amp_step(optimizer, out16=self.copies.out16_groups(optimizer), **decision.step_kwargs())
        return decision.applied(), decision.norm

    def zero_grads(self):
        self.buffers.zero()
        self.grad_sync.reset()

    def detach(self):
        self.grad_sync.detach()

    # ---- checkpoints and dsfast.utils: every rank holds whole parameters ------------------------------------
    def checkpoint_layout(self, names):
        return [SliceRecord(names[id(p)], tuple(p.shape), 0, p.numel(), self.copies.master_of(p), 0)
                for p in self.copies.params]

    @torch.no_grad()
    def after_checkpoint_load(self):
        if self.copies.params and self.copies.masters is not self.copies.params:   # none: nothing trains
            torch._foreach_copy_(self.copies.params, self.copies.masters)

    def full_fp32_param(self, param):
        return self.copies.master_of(param).detach().float().clone()

    def full_grad(self, param):
        return self.buffers.view_of(param).float() * self.post_reduce_factor

    def _state(self, param, key):
        state = self._optimizer.state.get(self.copies.master_of(param), {}) if self._optimizer else {}
        if key not in state:
            raise KeyError(f"optimizer state {key!r} does not exist (yet): available keys {sorted(state)}; "
                           "states appear after the first optimizer step")
        return state[key]

    def full_optimizer_state(self, param, key):
        return self._state(param, key).float().clone()

    local_fp32_param = full_fp32_param
    local_grad = full_grad
    local_optimizer_state = full_optimizer_state

    # ---- dsfast.utils' setters: every rank holds everything, so "local" is "full" ---------------------------
    @torch.no_grad()
    def set_full_fp32_param(self, param, value, api="safe_set_full_fp32_param"):
        master = self.copies.master_of(param)
        master.copy_(checked_value(value, master.numel(), api, _what(param)).view(master.shape))

    @torch.no_grad()
    def set_full_grad(self, param, value, api="safe_set_full_grad"):
        grad = self.buffers.view_of(param)   # the sum over ranks: the getters scale by post_reduce_factor
        value = checked_value(value, grad.numel(), api, _what(param))
        grad.copy_((value / self.post_reduce_factor).view(grad.shape))

    @torch.no_grad()
    def set_full_optimizer_state(self, param, value, key, api="safe_set_full_optimizer_state"):
        state = self._state(param, key)
        state.copy_(checked_value(value, state.numel(), api, _what(param)).view(state.shape))

    def set_local_fp32_param(self, param, value):
        self.set_full_fp32_param(param, value, "safe_set_local_fp32_param")

    def set_local_grad(self, param, value):
        self.set_full_grad(param, value, "safe_set_local_grad")

    def set_local_optimizer_state(self, param, value, key):
        self.set_full_optimizer_state(param, value, key, "safe_set_local_optimizer_state")

    def memory_tensors(self):
        prec = self.copies
        cats = {"params": [p.data for p in prec.params],
                "masters": list(prec.masters) if prec.masters is not prec.params else [],
                "grads": self.buffers.flats(), "optimizer_states": [], "comm_buffers": []}
        if self._optimizer is not None:
            for m in prec.masters:
                cats["optimizer_states"] += [t for t in self._optimizer.state.get(m, {}).values()
                                             if torch.is_tensor(t) and t.numel() > 1]
        return cats
