"""CPUAdam8bit / CPUAdamW8bit: Adam/AdamW on CPU tensors with 8-bit block-wise moments.

    opt = dsfast.optim.CPUAdam8bit(model.parameters(), lr=1e-3, weight_decay=0.01)   # AdamW by default

Each moment is one uint8 code per element plus one fp32 scale per block of 256 elements (Dettmers et al. 2022;
dsfast.ops.reference.adam8bit has the maps): 2.03 bytes a parameter for both moments instead of 8 (fp32) or 4
(bf16). One native pass per block dequantizes, updates (fp32 math, optim_math.h), requantizes and writes the param
(fp32 or bf16 master) and the optional 16-bit copy. Its own class, not a CPUAdam flag: the state has other keys
(exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, step), which a CPUAdam / torch.optim.Adam
state dict cannot be read as without a conversion. Loading one converts explicitly, with a log line, both ways:
CPUAdam8bit quantizes fp32 / 16-bit exp_avg and exp_avg_sq; CPUAdam (and its engine) dequantizes codes and scales.
"""
import torch

from . import _cpu_op, quant_state
from .validation import check_adam_group, check_adam_hparams
from ..utils.log import logger

_STATE_KEYS = ("step",) + quant_state.CODE_KEYS


class CPUAdam8bit(_cpu_op.CPUOptimizer):
    """Adam/AdamW (adamw_mode=True by default, as CPUAdam) with 8-bit block-wise moments; fp32 or bf16 params."""

    states_8bit = True   # the checkpoint loader re-quantizes into this layout (checkpoint/quant_slices.py)

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, adamw_mode=True, *, maximize=False, isa="auto", stochastic_rounding=False):
        check_adam_hparams(lr, betas, eps, weight_decay, amsgrad)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        bias_correction=bias_correction, adamw_mode=adamw_mode,
                        decoupled_weight_decay=adamw_mode, maximize=maximize)
        super().__init__(params, defaults, isa, True, stochastic_rounding)
        for group in self.param_groups:
            for j, p in enumerate(group["params"]):
                if p.dtype not in (torch.float32, torch.bfloat16):
                    raise TypeError(f"CPUAdam8bit: a parameter ({p.dtype}) of shape {tuple(p.shape)}: 8-bit states "
                                    "step float32 or bfloat16 parameters")

    @torch.no_grad()
    def step(self, closure=None, fp16_param_groups=None, *, grads=None, grad_scale=None, found_inf=None,
             clip_coef=None, out16=None):
        """One step; arguments as CPUAdam.step."""
        loss = self._run_closure(closure)
        multiplier, fp16_param_groups = self._amp_arguments(fp16_param_groups, grad_scale, found_inf, clip_coef,
                                                            out16)
        if multiplier is None:
            return loss
        self._step_groups(multiplier, fp16_param_groups, grads, lambda hparams: _STATE_KEYS, self._cached_step)
        return loss

    def _group_hyperparameters(self, group):
        return check_adam_group(group)

    def _step_group(self, gi, group, hparams, indices, grads, outs, multiplier):
        """Step group `gi`'s parameters at `indices` (grads / outs: theirs, or None: p.grad / no 16-bit copy);
        returns the parameters stepped (those with a gradient)."""
        params, gs, lists, outs, indices = self._gather(gi, group, indices, grads, outs)
        if params:
            scale = -multiplier if group.get("maximize") else multiplier
            self._kernel(gi, group, hparams, params, gs, lists, outs, scale, indices, self.round_seed())
        return params

    def _cached_step(self, gi, group, hparams, params, gs, lists, outs, scale, seed):
        """The list cache's tensors (_cpu_op.GroupCache): through its work table in eager mode, else the list op."""
        indices = range(len(params))
        if _cpu_op.tables_usable():
            native = _cpu_op.op()
            codes = [lists[k] for k in quant_state.CODE_KEYS]
            lr, (beta1, beta2), eps, wd = hparams
            if self._cache.table_step(
                    gi, "adam8bit", gs, (*codes, lists["step"]), outs,
                    lambda: _cpu_op.call(native.adam8bit_table, gi, indices, params, gs, *codes, outs, lists["step"]),
                    lambda table: native.adam8bit_table_step(table, lr, beta1, beta2, eps, wd,
                                                             bool(group["adamw_mode"]),
                                                             bool(group["bias_correction"]), scale,
                                                             _cpu_op.num_threads(), self.isa, seed)):
                return
        self._kernel(gi, group, hparams, params, gs, lists, outs, scale, indices, seed)

    def _kernel(self, gi, group, hparams, params, gs, lists, outs, scale, indices, seed):
        """The list op over these tensors (outs: [] or one 16-bit copy or None per param)."""
        lr, (beta1, beta2), eps, wd = hparams
        # flat views: a gradient handed in (step(grads=...)) may be the flat shape of its parameter
        _cpu_op.call(_cpu_op.op().adam8bit_step, gi, indices, [p.view(-1) for p in params],
                     [g.reshape(-1) for g in gs], *(lists[k] for k in quant_state.CODE_KEYS),
                     [o.view(-1) if o is not None else None for o in outs], lists["step"], lr, beta1, beta2, eps, wd,
                     bool(group["adamw_mode"]), bool(group["bias_correction"]), scale, _cpu_op.num_threads(),
                     self.isa, round_seed=seed)

    def _gather(self, gi, group, indices, listed=None, halves=None):
        def new_state(p):
            return {"step": torch.tensor(0.0, dtype=torch.float32), **quant_state.empty_state(p.numel())}

        def check(j, p, g, state):
            if not p.is_contiguous() or not g.is_contiguous():
                raise ValueError(f"param_groups[{gi}]['params'][{j}] or its gradient is not contiguous; the 8-bit "
                                 "kernel updates contiguous tensors in place")
        return _cpu_op.gather(self, group, indices, listed, halves, _STATE_KEYS, new_state, check)

    def load_state_dict(self, state_dict):
        # torch would cast the fp32 scales to a bf16 param's dtype: every state is taken from the saved dict
        # instead, in the kernel's layout; fp32 / 16-bit moments (CPUAdam, torch.optim.Adam) are quantized.
        saved = state_dict.get("state", {})
        saved_ids = [i for g in state_dict.get("param_groups", []) for i in g["params"]]
        torch.optim.Optimizer.load_state_dict(self, state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        converted = 0
        for i, p in zip(saved_ids, params):
            state, original = self.state.get(p), saved.get(i, {})
            if not state:
                continue
            where = f"CPUAdam8bit.load_state_dict: state of parameter {i}"
            if quant_state.is_quantized(original):
                moments = quant_state.check_codes(original, p.numel(), where)
            else:
                moments = quant_state.quantize_moments(original, p.numel(), where)
                converted += 1
            for key in quant_state.FLOAT_KEYS:
                state.pop(key, None)
            state.update(moments)
            _cpu_op.normalise_state(state)
        if converted:
            logger.info(f"CPUAdam8bit.load_state_dict: quantized the float exp_avg / exp_avg_sq of {converted} "
                        f"parameter(s) to 8-bit block-wise states (block {quant_state.QUANT_BLOCK})")


class CPUAdamW8bit(CPUAdam8bit):
    """AdamW with 8-bit moments: torch.optim.AdamW's defaults (weight_decay=0.01)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, bias_correction=True, isa="auto", stochastic_rounding=False):
        super().__init__(params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         weight_decay=weight_decay, amsgrad=amsgrad, adamw_mode=True, maximize=maximize, isa=isa,
                         stochastic_rounding=stochastic_rounding)
