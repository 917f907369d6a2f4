"""CPUAdam / CPUAdamW: torch.optim-compatible Adam and AdamW over dsfast's SIMD CPU kernels.

    opt = dsfast.optim.CPUAdam(model.parameters(), lr=1e-3, weight_decay=0.01)   # AdamW by default
    opt = dsfast.optim.CPUAdam(params, adamw_mode=False)                          # Adam with L2 decay

* fp32 parameters and states on the CPU; gradients may be fp32, bf16 or fp16 and are read
  directly by the kernel (no conversion pass). bf16 / fp16 parameters (ZeRO's 16-bit masters:
  bf16_master_weights_and_grads) are stepped in place too, with fp32 states, or states in their own
  dtype with fp32_optimizer_states=False (bf16_optimizer_states); every element is computed in fp32
  registers and rounded to nearest even on the store, no fp32 copy made. stochastic_rounding=True (off by
  default) rounds bf16 parameters stochastically instead (reproducibly: the seeds come from a private generator).
* One native call per param group updates every tensor of the group in ONE OpenMP parallel
  region, with torch.get_num_threads() threads; the kernel body (AVX-512, AVX2 or scalar) is
  picked for the running CPU; `isa=` forces one (tests, benchmarks).
* State is torch's own layout (`step` as a float32 scalar tensor, `exp_avg`, `exp_avg_sq`), so
  state dicts move between this and torch.optim.Adam/AdamW in both directions.
* `step(fp16_param_groups=...)` (as DeepSpeedCPUAdam) also writes each updated parameter into
  a bf16/fp16 tensor in the same pass.
* amsgrad is not implemented and raises a ValueError.
* `step_subgroup(i)` / `rollback_subgroup(i)` (DeepSpeedCPUAdam's, ZeRO-3 super-offload): one step of the one
  parameter with a gradient, state under the int key i, and its exact algebraic undo (no copy kept).

Flat-buffer entry point for the ZeRO / CPU-offload engine: `adam_flat_step` updates one
contiguous fp32 partition from its gradient (fp32/bf16/fp16), optionally writing the
updated values into a 16-bit buffer (round-to-nearest-even) in the same pass.
"""
import math

import torch

from . import _cpu_op, functional
from .validation import check_adam_group, check_adam_hparams

_STATE_KEYS = ("exp_avg", "exp_avg_sq", "step")


def adam_flat_step(param, grad, exp_avg, exp_avg_sq, step, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                   adamw=True, bias_correction=True, grad_scale=1.0, out16=None, num_threads=None, isa="auto"):
    """One Adam/AdamW step on a flat fp32 partition, in place.

    param, exp_avg, exp_avg_sq: contiguous fp32 CPU tensors of n elements.
    grad: contiguous fp32, bf16 or fp16 CPU tensor of n elements (read as-is).
    step: the one-element float32 tensor holding the number of steps taken so far; it is
        incremented in place (torch's convention). A plain int is also accepted.
    grad_scale: multiplies the gradient first (e.g. 1 / loss_scale).
    out16: optional bf16/fp16 tensor of n elements receiving the updated parameter.
    Returns the new step count (int).
    """
    lr, (beta1, beta2), eps, weight_decay = check_adam_hparams(lr, betas, eps, weight_decay)
    step_t = step if isinstance(step, torch.Tensor) else torch.tensor(float(step), dtype=torch.float32)
    flat = [t.view(-1) if isinstance(t, torch.Tensor) and t.is_contiguous() else t
            for t in (param, grad, exp_avg, exp_avg_sq)]
    outs = [out16.view(-1) if out16.is_contiguous() else out16] if out16 is not None else []
    _cpu_op.call(_cpu_op.op().adam_step, None, [0], [flat[0]], [flat[1]], [flat[2]], [flat[3]], outs, [step_t],
                 lr, beta1, beta2, eps, weight_decay, bool(adamw), bool(bias_correction), float(grad_scale),
                 num_threads or _cpu_op.num_threads(), isa)
    return int(step_t.item())


class CPUAdam(_cpu_op.CPUOptimizer):
    """Adam/AdamW on CPU tensors (DeepSpeedCPUAdam's signature; adamw_mode=True by default)."""

    _dsfast_states_per_element = 2   # exp_avg, exp_avg_sq (optim/element_wise.py)

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, adamw_mode=True, fp32_optimizer_states=True, *, maximize=False, isa="auto",
                 stochastic_rounding=False):
        check_adam_hparams(lr, betas, eps, weight_decay, amsgrad)
        # decoupled_weight_decay is torch.optim.Adam's name for adamw_mode: kept equal so that
        # state dicts carry the right rule to and from torch.
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        bias_correction=bias_correction, adamw_mode=adamw_mode,
                        decoupled_weight_decay=adamw_mode, maximize=maximize)
        super().__init__(params, defaults, isa, fp32_optimizer_states, stochastic_rounding)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("bias_correction", True)
            if "adamw_mode" not in group:   # a state dict from torch.optim.Adam/AdamW
                group["adamw_mode"] = bool(group.get("decoupled_weight_decay", getattr(self, "_default_adamw", True)))
            group["decoupled_weight_decay"] = group["adamw_mode"]

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None, *, grads=None, grad_scale=None, found_inf=None,
             clip_coef=None, out16=None):
        """One step. fp16_param_groups (or out16): optional, per group, a list of bf16/fp16 tensors
        (one per param) that receive the updated parameters in the same pass. grads, grad_scale,
        found_inf, clip_coef: the amp contract (optim/amp_step.py), applied inside the kernel."""
        loss = self._run_closure(closure)
        multiplier, fp16_param_groups = self._amp_arguments(fp16_param_groups, grad_scale, found_inf, clip_coef,
                                                            out16)
        if multiplier is None:
            return loss
        self._step_groups(multiplier, fp16_param_groups, grads, lambda hparams: _STATE_KEYS, self._cached_step)
        return loss

    def _cached_step(self, gi, group, hparams, params, gs, t, outs, scale, seed):
        """The list cache's tensors (_cpu_op.GroupCache): through its work table in eager mode, else the list op."""
        indices = range(len(params))
        lr, (beta1, beta2), eps, wd = hparams
        adamw = bool(group["adamw_mode"])
        group["decoupled_weight_decay"] = adamw
        if _cpu_op.tables_usable():
            native = _cpu_op.op()
            if self._cache.table_step(
                    gi, "adam", gs, (t["exp_avg"], t["exp_avg_sq"], t["step"]), outs,
                    lambda: _cpu_op.call(native.adam_table, gi, indices, params, gs, t["exp_avg"],
                                         t["exp_avg_sq"], outs, t["step"]),
                    lambda table: native.adam_table_step(table, lr, beta1, beta2, eps, wd, adamw,
                                                         bool(group["bias_correction"]), scale,
                                                         _cpu_op.num_threads(), self.isa, seed)):
                return
        self._kernel(group, hparams, params, gs, t["exp_avg"], t["exp_avg_sq"], t["step"], outs, scale, gi,
                     indices, seed)

    # -- per-subgroup step and its undo (DeepSpeedCPUAdam.step_subgroup / rollback_subgroup, ZeRO-3 super-offload) --

    @torch.no_grad()
    def step_subgroup(self, subgroup_id, closure=None):
        """One Adam step of subgroup `subgroup_id` (DeepSpeed 0.19.8's DeepSpeedCPUAdam.step_subgroup).

        A subgroup is the one parameter that has a gradient among all param groups (ZeRO-3 puts a subgroup's flat
        fp32 partition there before calling it); its state is self.state[subgroup_id] (an int key, so that the
        same state follows the subgroup whatever tensor holds it): 'step' (an int, as DeepSpeed's), 'exp_avg',
        'exp_avg_sq'. No parameter with a gradient: nothing is done (DeepSpeed's behaviour). The update is the
        SIMD kernel's, bit-identical to step() on the same values."""
        loss = self._run_closure(closure)
        sid = _subgroup_key(subgroup_id)
        found = self._subgroup_member(sid, "step_subgroup")
        if found is None:
            return loss
        gi, j, group, p = found
        hparams = self._group_hyperparameters(group)
        state = self.state[sid]
        if len(state) == 0:
            dtype = self.state_dtype(p)
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)
        else:
            _check_subgroup_state(sid, state, p)
        step_t = torch.tensor(float(state["step"]), dtype=torch.float32)
        adamw = bool(group["adamw_mode"])
        group["decoupled_weight_decay"] = adamw
        scale = -1.0 if group.get("maximize") else 1.0
        self._kernel(group, hparams, [p], [p.grad], [state["exp_avg"]], [state["exp_avg_sq"]], [step_t], [], scale,
                     gi, [j], self.round_seed())
        state["step"] = int(step_t.item())
        return loss

    @torch.no_grad()
    def rollback_subgroup(self, subgroup_id, closure=None):
        """Undo the last step_subgroup(subgroup_id) (DeepSpeed 0.19.8's DeepSpeedCPUAdam.rollback_subgroup).

        Exact algebraic inversion of the update, as DeepSpeed's, from the stepped values and the gradient the step
        used (still in .grad) with the group's current hyperparameters (those of the step): computed in float64,
        the parameter, exp_avg and exp_avg_sq come back to within a few fp32 ulps of their values before the
        step (one rounding of their dtype for 16-bit ones), and exactly (zeros) when the step count returns to 0;
        no copy is kept, so rollbacks may go back any number of steps at no memory cost (each one undoes the rounding
        of one step only: going back several steps, exp_avg_sq's absolute error, about an ulp of its later values,
        grows relative to earlier values much smaller than those, as DeepSpeed's inversion does). The step count is
        decremented. Errors (RuntimeError): a subgroup never stepped, a step count of 0, no parameter with a
        gradient; ValueError: a state that does not match the parameter, or an update that cannot be inverted
        (beta1 or beta2 of 0 past the first step, AdamW with lr * weight_decay == 1)."""
        loss = self._run_closure(closure)
        sid = _subgroup_key(subgroup_id)
        state = self.state.get(sid)
        if not state:
            raise RuntimeError(f"Cannot rollback optimizer state for sub_group_id {sid} as it has not been "
                               f"initialized.")
        t = int(state.get("step", 0))
        if t <= 0:
            raise RuntimeError(f"Cannot rollback sub_group_id {sid}: step count is {t}")
        found = self._subgroup_member(sid, "rollback_subgroup")
        if found is None:
            raise RuntimeError(f"Cannot rollback sub_group_id {sid}: no parameter has a gradient (the rollback "
                               f"inverts the step with the gradient it used)")
        _, _, group, p = found
        _check_subgroup_state(sid, state, p)
        lr, (beta1, beta2), eps, wd = self._group_hyperparameters(group)
        adamw = bool(group["adamw_mode"])
        if t > 1 and (beta1 == 0.0 or beta2 == 0.0):
            raise ValueError(f"Cannot rollback sub_group_id {sid}: with beta1 or beta2 of 0 the moments before the "
                             f"step are not recoverable (betas={group['betas']})")
        if adamw and lr * wd == 1.0:
            raise ValueError(f"Cannot rollback sub_group_id {sid}: AdamW with lr * weight_decay == 1 zeroes the "
                             f"parameter before the update")
        m, v = state["exp_avg"], state["exp_avg_sq"]
        g = p.grad.detach().reshape(p.shape).to(torch.float64)
        if group.get("maximize"):
            g = -g
        p1 = p.detach().to(torch.float64)
        m1, v1 = m.to(torch.float64).reshape(p.shape), v.to(torch.float64).reshape(p.shape)
        if group["bias_correction"]:
            bc1, bc2 = 1.0 - beta1 ** t, 1.0 - beta2 ** t
        else:
            bc1 = bc2 = 1.0
        # the kernel: p = p * (1 - lr * wd [AdamW]) - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)
        p0 = p1 + (lr / bc1) * m1 / (v1.sqrt() / math.sqrt(bc2) + eps)
        if adamw and wd != 0.0:
            p0 = p0 / (1.0 - lr * wd)
        elif wd != 0.0:
            g = g + wd * p0   # Adam's L2 term entered the moments with the parameter before the step
        p.data.copy_(p0)
        if t == 1:   # back to the state's creation
            m.zero_()
            v.zero_()
        else:        # m = m + (1 - beta1) * (g - m); v = beta2 * v + (1 - beta2) * g * g
            m.copy_(((m1 - (1.0 - beta1) * g) / beta1).reshape(m.shape))
            v.copy_(((v1 - (1.0 - beta2) * g * g) / beta2).clamp_(min=0.0).reshape(v.shape))
        state["step"] = t - 1
        return loss

    def _subgroup_member(self, sid, what):
        """(group index, index in the group, group, parameter) of the one parameter with a gradient, or None."""
        found = [(gi, j, group, p) for gi, group in enumerate(self.param_groups)
                 for j, p in enumerate(group["params"]) if p.grad is not None]
        if len(found) > 1:
            raise ValueError(f"{what}({sid}): {len(found)} parameters have a gradient; a subgroup is one tensor (its "
                             f"flat partition), the only parameter with a gradient")
        if not found:
            return None
        gi, j, group, p = found[0]
        if p.device.type != "cpu":
            raise ValueError(f"{what}({sid}): param_groups[{gi}]['params'][{j}] is on {p.device}; CPUAdam steps CPU "
                             f"tensors (enable 'offload_optimizer': 'cpu' in the ZeRO config)")
        return found[0]

    def _group_hyperparameters(self, group):
        return check_adam_group(group)

    def _step_group(self, gi, group, hparams, indices, grads, outs, multiplier):
        """Step group `gi`'s parameters at `indices` (grads / outs: theirs, or None: p.grad / no 16-bit copy), their
        states created on first use; returns the parameters stepped (those with a gradient)."""
        params, gs, ms, vs, steps, outs, indices = self._gather(group, indices, grads, outs)
        if params:
            adamw = bool(group["adamw_mode"])
            group["decoupled_weight_decay"] = adamw
            scale = -multiplier if group.get("maximize") else multiplier
            self._kernel(group, hparams, params, gs, ms, vs, steps, outs, scale, gi, indices, self.round_seed())
        return params

    def _kernel(self, group, hparams, params, gs, ms, vs, steps, outs, scale, gi, indices, seed):
        lr, betas, eps, wd = hparams
        functional.adam_(params, gs, ms, vs, steps, lr=lr, betas=betas, eps=eps, weight_decay=wd,
                         adamw=bool(group["adamw_mode"]), bias_correction=bool(group["bias_correction"]),
                         grad_scale=scale, out16=outs, isa=self.isa, group_index=gi, indices=indices,
                         round_seed=seed, validated=True)

    def _gather(self, group, indices, listed=None, halves=None):
        """The kernel lists of the group's parameters at `indices` that have a gradient (listed: the gradients,
        aligned with indices; None: p.grad), their states created on first use."""
        def new_state(p):
            dtype = self.state_dtype(p)
            return {"step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format),
                    "exp_avg_sq": torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)}
        params, grads, lists, outs, kept = _cpu_op.gather(self, group, indices, listed, halves,
                                                          ("exp_avg", "exp_avg_sq", "step"), new_state)
        return params, grads, lists["exp_avg"], lists["exp_avg_sq"], lists["step"], outs, kept


def _subgroup_key(subgroup_id):
    """A subgroup id: a non-negative int (a state key beside the parameters' tensor keys)."""
    if isinstance(subgroup_id, bool) or not isinstance(subgroup_id, int):
        try:
            import numpy as np
            if isinstance(subgroup_id, np.integer):
                subgroup_id = int(subgroup_id)
        except ImportError:
            pass
    if isinstance(subgroup_id, bool) or not isinstance(subgroup_id, int):
        raise TypeError(f"subgroup_id must be an int, got {type(subgroup_id).__name__}")
    if subgroup_id < 0:
        raise ValueError(f"subgroup_id must be >= 0, got {subgroup_id}")
    return int(subgroup_id)


def _check_subgroup_state(sid, state, p):
    """The subgroup's state must be the one made for a tensor of p's size."""
    for key in ("exp_avg", "exp_avg_sq"):
        if key not in state or "step" not in state:
            raise ValueError(f"the state of sub_group_id {sid} has no '{key}' / 'step' (not a subgroup's state)")
        if state[key].numel() != p.numel():
            raise ValueError(f"sub_group_id {sid}: its state '{key}' has {state[key].numel()} elements but the "
                             f"parameter with a gradient has {p.numel()}; a subgroup keeps its size")


class CPUAdamW(CPUAdam):
    """AdamW on CPU tensors: torch.optim.AdamW's signature and defaults (weight_decay=0.01)."""

    _default_adamw = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, bias_correction=True, isa="auto"):
        super().__init__(params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, adamw_mode=True, maximize=maximize, isa=isa)

