"""CPUSGD: torch.optim.SGD semantics (momentum, dampening, nesterov, weight decay) over
dsfast's SIMD CPU kernels, one parallel region per param group.

fp32 parameters and momentum buffers; gradients fp32, bf16 or fp16 read directly. bf16 / fp16 parameters
(16-bit masters) with fp32 buffers, or buffers in their own dtype with fp32_optimizer_states=False;
stochastic_rounding=True as CPUAdam's. State is
torch's layout (`momentum_buffer`, present once a step with momentum != 0 has run), so state
dicts move between this and torch.optim.SGD both ways. `step(fp16_param_groups=...)` also
writes the updated parameters into bf16/fp16 tensors in the same pass.

Flat-buffer entry point for the offload engine: `sgd_flat_step`.
"""
import torch

from . import _cpu_op, functional
from .validation import check_sgd_hparams, check_unsupported_flags


def sgd_flat_step(param, grad, momentum_buffer=None, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                  nesterov=False, first_step=False, grad_scale=1.0, out16=None, num_threads=None, isa="auto"):
    """One SGD step on a flat fp32 partition, in place. With momentum, `momentum_buffer` (fp32,
    same size) is required; first_step=True seeds it with the gradient as torch does."""
    lr, momentum, dampening, weight_decay, nesterov = check_sgd_hparams(lr, momentum, dampening, weight_decay,
                                                                        nesterov)
    if momentum != 0 and momentum_buffer is None:
        raise ValueError("momentum != 0 needs a momentum_buffer (an fp32 tensor the size of param)")
    view = lambda t: t.view(-1) if isinstance(t, torch.Tensor) and t.is_contiguous() else t  # noqa: E731
    bufs = [view(momentum_buffer)] if momentum != 0 else []
    outs = [view(out16)] if out16 is not None else []
    _cpu_op.call(_cpu_op.op().sgd_step, None, [0], [view(param)], [view(grad)], bufs, outs, [bool(first_step)],
                 lr, momentum, dampening, weight_decay, nesterov, float(grad_scale),
                 num_threads or _cpu_op.num_threads(), isa)


class CPUSGD(_cpu_op.CPUOptimizer):
    _dsfast_states_per_element = "momentum"   # a buffer where a group has momentum (optim/element_wise.py)

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, isa="auto", fp32_optimizer_states=True, stochastic_rounding=False):
        check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov)
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults, isa, fp32_optimizer_states, stochastic_rounding)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)
            group.setdefault("maximize", False)

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None, *, grads=None, grad_scale=None, found_inf=None,
             clip_coef=None, out16=None):
        """One step; fp16_param_groups / out16 and the amp arguments as CPUAdam.step."""
        loss = self._run_closure(closure)
        multiplier, fp16_param_groups = self._amp_arguments(fp16_param_groups, grad_scale, found_inf, clip_coef,
                                                            out16)
        if multiplier is None:
            return loss
        self._step_groups(multiplier, fp16_param_groups, grads,
                          lambda hparams: ("momentum_buffer",) if hparams[1] != 0 else (), self._cached_step)
        return loss

    def _cached_step(self, gi, group, hparams, params, gs, t, outs, scale, seed):
        """The list cache's tensors (_cpu_op.GroupCache): through its work table in eager mode, else the list op."""
        lr, momentum, dampening, wd, nesterov = hparams
        bufs = t["momentum_buffer"] if momentum != 0 else []
        firsts = [False] * len(params) if momentum != 0 else []
        indices = range(len(params))
        if _cpu_op.tables_usable():   # buffers all seeded: the table path
            native = _cpu_op.op()
            if self._cache.table_step(
                    gi, ("sgd", momentum != 0), gs, (bufs,), outs,
                    lambda: _cpu_op.call(native.sgd_table, gi, indices, params, gs, bufs, outs),
                    lambda table: native.sgd_table_step(table, lr, momentum, dampening, wd, nesterov,
                                                        scale, _cpu_op.num_threads(), self.isa, seed)):
                return
        self._kernel(hparams, params, gs, bufs, firsts, outs, scale, gi, indices, seed)

    def _group_hyperparameters(self, group):
        """The group's validated (lr, momentum, dampening, weight_decay, nesterov); refuses flags it cannot honour."""
        hparams = check_sgd_hparams(group["lr"], group["momentum"], group["dampening"], group["weight_decay"],
                                    group["nesterov"])
        check_unsupported_flags(group, ("foreach", "fused", "differentiable"))
        return hparams

    def _step_group(self, gi, group, hparams, indices, grads, outs, multiplier):
        """Step group `gi`'s parameters at `indices` (grads / outs: theirs, or None: p.grad / no 16-bit copy);
        returns the parameters stepped (those with a gradient)."""
        params, gs, bufs, firsts, outs, indices = self._gather(group, indices, hparams[1], grads, outs)
        if not params:
            return params
        scale = -multiplier if group.get("maximize") else multiplier
        self._kernel(hparams, params, gs, bufs, firsts, outs, scale, gi, indices, self.round_seed())
        # new buffers enter the state only once seeded: a refused step leaves no garbage buffer
        for p, buf, first in zip(params, bufs, firsts):
            if first:
                self.state[p]["momentum_buffer"] = buf
        return params

    def _kernel(self, hparams, params, gs, bufs, firsts, outs, scale, gi, indices, seed):
        lr, momentum, dampening, wd, nesterov = hparams
        functional.sgd_(params, gs, bufs, firsts, lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=wd, nesterov=nesterov, grad_scale=scale,
                        out16=outs, isa=self.isa, group_index=gi, indices=indices, round_seed=seed,
                        validated=True)

    def _gather(self, group, indices, momentum, listed=None, halves=None):
        params, grads, bufs, firsts, outs, kept = [], [], [], [], [], []
        group_params = group["params"]
        for k, j in enumerate(indices):
            p = group_params[j]
            g = listed[k] if listed is not None else p.grad
            if g is None:
                continue
            _cpu_op.check_dense(self, group, j, g)
            params.append(p)
            grads.append(g)
            kept.append(j)
            if momentum != 0:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                first = buf is None
                if first:   # torch seeds the buffer with the first gradient; the kernel does the same
                    buf = torch.empty_like(p, dtype=self.state_dtype(p), memory_format=torch.contiguous_format)
                bufs.append(buf)
                firsts.append(first)
            if halves is not None:
                outs.append(halves[k])
        return params, grads, bufs, firsts, outs, kept
