"""FusedAdam: torch.optim-compatible Adam/AdamW over dsfast's multi-tensor CUDA kernel.

    opt = dsfast.optim.FusedAdam(model.parameters(), lr=1e-3, weight_decay=0.01)   # AdamW (adam_w_mode)
    opt = dsfast.optim.FusedAdam(params, adam_w_mode=False)                         # Adam, L2 decay

* DeepSpeed's FusedAdam signature. One kernel launch updates hundreds of tensors; params may be
  fp32, fp16 or bf16 and gradients fp32, fp16 or bf16, read as they are (math in fp32).
* State is torch's fused layout: `step` a float32 scalar tensor on the param's device,
  `exp_avg`, `exp_avg_sq` in the param's dtype, so state dicts move to and from
  torch.optim.Adam/AdamW. With master_weights=True a 16-bit param also gets an fp32
  `master_param` and fp32 moments; the kernel updates the master and writes the rounded
  value into the param in the same pass.
* Mixed precision without host syncs: step(grad_scale=, found_inf=, clip_coef=) (device
  tensors) unscales and clips the gradients inside the kernel and skips the whole update,
  step counts included, when found_inf is set. torch.amp.GradScaler drives it as it drives
  torch's fused optimizers (`_step_supports_amp_scaling`).
* CUDA params use the native op (built on first use, see dsfast.ops); other devices, or a
  machine that cannot build it, run the pure-torch reference with the same results.
"""
import torch

from ..ops import multi_tensor
from ._fused_common import FusedOptimizer, amp_scalars, gather
from .validation import check_adam_hparams, check_unsupported_flags

def steps_back_on_overflow(steps, found_inf):
    """Undo the step-count increment of a skipped step, on the device (as torch's fused Adam)."""
    if found_inf is not None and steps:
        torch._foreach_sub_(steps, [found_inf] * len(steps))


class FusedAdam(FusedOptimizer):
    """Adam/AdamW; adam_w_mode=True (default) decouples weight decay as AdamW does."""

    _dsfast_states_per_element = 2   # exp_avg, exp_avg_sq (optim/element_wise.py)

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True, *, maximize=False, master_weights=False):
        check_adam_hparams(lr, betas, eps, weight_decay, amsgrad)
        self._set_master_weights(master_weights)
        self.adam_w_mode = bool(adam_w_mode)
        self.set_grad_none = set_grad_none
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            _group_defaults(group)

    def zero_grad(self, set_to_none=None):
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

    def load_state_dict(self, state_dict):
        # torch casts loaded state to the param's dtype; keep fp32 master state fp32.
        saved = {k: dict(v) for k, v in state_dict.get("state", {}).items()}
        super().load_state_dict(state_dict)
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(ids, params):
            state = self.state.get(p)
            if state:
                _normalise_state(p, state, saved.get(pid, {}), self._uses_master(p))
        for group in self.param_groups:
            _group_defaults(group)

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale=None, found_inf=None, clip_coef=None, grads=None, out16=None):
        """One step. grad_scale: the loss scale the gradients carry (divided out in the kernel);
        found_inf: skip the step when nonzero; clip_coef: multiplies the unscaled gradients.
        All three are optional one-element float32 tensors; GradScaler sets the first two.
        grads / out16: per group, gradients to read instead of p.grad and 16-bit tensors that
        receive the updated fp32 params (optim/amp_step.py)."""
        loss, grad_scale, found_inf = self._begin_step(closure, grad_scale, found_inf)
        scalars = {}
        for gi, group in enumerate(self.param_groups):
            self._step_group(gi, group, self._group_hyperparameters(group), group,
                             grads[gi] if grads is not None else None, out16[gi] if out16 is not None else None,
                             (grad_scale, found_inf, clip_coef), scalars)
        return loss

    def _group_hyperparameters(self, group):
        """The group's validated (lr, betas, eps, weight_decay); refuses flags it cannot honour."""
        hparams = check_adam_hparams(group["lr"], group["betas"], group["eps"], group["weight_decay"],
                                     group.get("amsgrad", False))
        check_unsupported_flags(group, ("differentiable",))
        return hparams

    def _step_group(self, gi, group, hparams, members, grads, outs, amp, scalars):
        """Step members["params"] (all of `group`'s, or some) with `group`'s settings; amp: (grad_scale,
        found_inf, clip_coef); scalars: their device copies, made once per step."""
        lr, (beta1, beta2), eps, wd = hparams
        buckets = gather(members, gi, self.state, self.master_weights, _init_state, _STATE_KEYS, grads, outs)
        for (device, _, _, _, _), (gs, ps, (ms, vs, steps), copies) in buckets.items():
            inv, flag, coef = amp_scalars(device, *amp, scalars)
            torch._foreach_add_(steps, 1)
            multi_tensor.backend(device).adam_(
                gs, ps, ms, vs, steps, copies, lr, beta1, beta2, eps, wd, self.adam_w_mode,
                bool(group["bias_correction"]), inv, coef, flag, bool(group["maximize"]))
            steps_back_on_overflow(steps, flag)


def _group_defaults(group):
    group.setdefault("bias_correction", True)
    group.setdefault("amsgrad", False)
    group.setdefault("maximize", False)


_STATE_KEYS = ("exp_avg", "exp_avg_sq", "step")


def _init_state(p, state, master):
    dtype = torch.float32 if master else p.dtype
    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
    state["exp_avg"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)
    state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype, memory_format=torch.contiguous_format)
    if master:
        state["master_param"] = p.detach().to(torch.float32, memory_format=torch.contiguous_format).clone()
    return False


def _normalise_state(p, state, saved, master):
    """Loaded state in the kernel's layout: step a float32 scalar on the param's device, moments
    contiguous in the param's dtype (fp32 with master weights, from the saved full precision)."""
    step = state.get("step")
    if step is not None:
        state["step"] = torch.as_tensor(step, dtype=torch.float32).reshape(()).to(p.device).clone()
    dtype = torch.float32 if master else p.dtype
    for key in ("exp_avg", "exp_avg_sq"):
        if key in state:
            if master:  # from the saved tensor, not torch's copy rounded to the param's dtype
                state[key] = saved.get(key, state[key]).to(device=p.device, dtype=dtype, copy=True,
                                                           memory_format=torch.contiguous_format)
            else:
                state[key] = state[key].to(device=p.device, dtype=dtype, memory_format=torch.contiguous_format)
    if master:
        src = saved.get("master_param")
        state["master_param"] = (src if src is not None else p.detach()).to(
            device=p.device, dtype=torch.float32, copy=True, memory_format=torch.contiguous_format)
    else:
        state.pop("master_param", None)
