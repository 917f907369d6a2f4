"""The step of the CPU optimizers with one state tensor per parameter (CPUAdagrad: the sum of squared gradients,
CPULion: the momentum): gather each group's tensors (or take them from the list cache), then one native call per
group over all of them (a work table of them once cached, as CPUAdam's). A subclass names its state key, validates
its group and calls its kernels."""
import torch

from . import _cpu_op
from .validation import check_unsupported_flags


class OneStateCPUOptimizer(_cpu_op.CPUOptimizer):
    STATE_KEY = None   # the per-element state in optimizer.state[p] (DeepSpeed's name for it)

    def _hyperparameters(self, group):
        """The group's validated hyperparameters, as _kernel takes them."""
        raise NotImplementedError

    def _kernel(self, hparams, params, grads, states, outs, steps, grad_scale, group_index, indices, seed):
        """The list op over these tensors."""
        raise NotImplementedError

    def _table_kernel(self, native, table, hparams, grad_scale, seed):
        """The table op over a work table of the group's tensors; False if a tensor of it moved."""
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None, *, grads=None, grad_scale=None, found_inf=None,
             clip_coef=None, out16=None):
        """One step. fp16_param_groups (or out16): optional, per group, a list of bf16/fp16 tensors (one per param)
        that receive the updated parameters in the same pass. grads, grad_scale, found_inf, clip_coef: the amp
        contract (optim/amp_step.py), applied inside the kernel."""
        loss = self._run_closure(closure)
        multiplier, fp16_param_groups = self._amp_arguments(fp16_param_groups, grad_scale, found_inf, clip_coef,
                                                            out16)
        if multiplier is None:
            return loss
        self._step_groups(multiplier, fp16_param_groups, grads, lambda hparams: (self.STATE_KEY, "step"),
                          self._cached_step)
        return loss

    def _cached_step(self, gi, group, hparams, params, gs, t, outs, scale, seed):
        """The list cache's tensors (_cpu_op.GroupCache): through its work table in eager mode, else the list op."""
        states, steps = t[self.STATE_KEY], t["step"]
        indices = range(len(params))
        if _cpu_op.tables_usable():
            native = _cpu_op.op()
            if self._cache.table_step(
                    gi, self.STATE_KEY, gs, (states, steps), outs,
                    lambda: _cpu_op.call(native.one_state_table, gi, indices, params, gs, states, outs, steps,
                                         self.STATE_KEY),
                    lambda table: self._table_kernel(native, table, hparams, scale, seed)):
                return
        self._kernel(hparams, params, gs, states, outs, steps, scale, gi, indices, seed)

    def _group_hyperparameters(self, group):
        """The group's validated hyperparameters; refuses flags it cannot honour."""
        hparams = self._hyperparameters(group)
        check_unsupported_flags(group, ("foreach", "fused", "capturable", "differentiable"))
        return hparams

    def _step_group(self, gi, group, hparams, indices, grads, outs, multiplier):
        """Step group `gi`'s parameters at `indices` (grads / outs: theirs, or None: p.grad / no 16-bit copy), their
        states created on first use; returns the parameters stepped (those with a gradient)."""
        params, gs, states, steps, outs, indices = self._gather(gi, group, indices, grads, outs)
        if params:
            scale = -multiplier if group.get("maximize") else multiplier
            self._kernel(hparams, params, gs, states, outs, steps, scale, gi, indices, self.round_seed())
        return params

    def _gather(self, group_index, group, indices, listed=None, halves=None):
        def new_state(p):
            return {"step": torch.tensor(0.0, dtype=torch.float32),
                    self.STATE_KEY: torch.zeros_like(p, dtype=self.state_dtype(p),
                                                     memory_format=torch.contiguous_format)}

        def check(j, p, g, state):
            if self.STATE_KEY not in state:
                raise ValueError(f"param_groups[{group_index}]['params'][{j}] has optimizer state "
                                 f"{sorted(state)} without {self.STATE_KEY!r}: it was loaded from another "
                                 f"optimizer's state dict; load one saved by {type(self).__name__}")
        params, grads, lists, outs, kept = _cpu_op.gather(self, group, indices, listed, halves,
                                                          (self.STATE_KEY, "step"), new_state, check)
        return params, grads, lists[self.STATE_KEY], lists["step"], outs, kept
