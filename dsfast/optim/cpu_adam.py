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

Flat-buffer entry point for the ZeRO / CPU-offload engine: `adam_flat_step` updates one
contiguous fp32 partition from its gradient (fp32/bf16/fp16), optionally writing the
updated values into a 16-bit buffer (round-to-nearest-even) in the same pass.
"""
import torch

from . import _cpu_op, functional
from .validation import check_adam_hparams, check_unsupported_flags

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
        for gi, group in enumerate(self.param_groups):
            hparams = self._group_hyperparameters(group)
            halves = _cpu_op.half_outputs(fp16_param_groups, gi, group)
            listed = grads[gi] if grads is not None else None
            cached = self._cache.lookup(self, gi, group, _STATE_KEYS) if listed is None else None
            if cached is None:
                stepped = self._step_group(gi, group, hparams, range(len(group["params"])), listed, halves,
                                           multiplier)
                if listed is None:
                    self._cache.store(self, gi, group, stepped, _STATE_KEYS)
                continue
            params, gs, t = cached
            if not params:
                continue
            outs, indices = (halves or []), range(len(params))
            lr, (beta1, beta2), eps, wd = hparams
            adamw = bool(group["adamw_mode"])
            group["decoupled_weight_decay"] = adamw
            scale = -multiplier if group.get("maximize") else multiplier
            seed = self.round_seed()
            if _cpu_op.tables_usable():
                native = _cpu_op.op()
                if self._cache.table_step(
                        gi, "adam", gs, (t["exp_avg"], t["exp_avg_sq"], t["step"]), outs,
                        lambda: _cpu_op.call(native.adam_table, gi, indices, params, gs, t["exp_avg"],
                                             t["exp_avg_sq"], outs, t["step"]),
                        lambda table: native.adam_table_step(table, lr, beta1, beta2, eps, wd, adamw,
                                                             bool(group["bias_correction"]), scale,
                                                             _cpu_op.num_threads(), self.isa, seed)):
                    continue
            self._kernel(group, hparams, params, gs, t["exp_avg"], t["exp_avg_sq"], t["step"], outs, scale, gi,
                         indices, seed)
        return loss

    def _group_hyperparameters(self, group):
        """The group's validated hyperparameters (lr, betas, eps, weight_decay); refuses flags it cannot honour."""
        hparams = check_adam_hparams(group["lr"], group["betas"], group["eps"], group["weight_decay"],
                                     group.get("amsgrad", False))
        check_unsupported_flags(group, ("foreach", "fused", "capturable", "differentiable"))
        return hparams

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


class CPUAdamW(CPUAdam):
    """AdamW on CPU tensors: torch.optim.AdamW's signature and defaults (weight_decay=0.01)."""

    _default_adamw = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, bias_correction=True, isa="auto"):
        super().__init__(params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, adamw_mode=True, maximize=maximize, isa=isa)

