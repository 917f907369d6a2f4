"""FusedSGD: torch.optim.SGD-compatible SGD over dsfast's multi-tensor CUDA kernel.

    opt = dsfast.optim.FusedSGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)

* torch.optim.SGD's signature and semantics (momentum, dampening, nesterov, weight decay,
  maximize); params fp32, fp16 or bf16, gradients fp32, fp16 or bf16 (math in fp32).
* State is torch's layout (`momentum_buffer` in the param's dtype, only when momentum != 0),
  so state dicts move to and from torch.optim.SGD. master_weights=True keeps an fp32
  `master_param` (and an fp32 buffer) for 16-bit params and writes the param in the same pass.
* step(grad_scale=, found_inf=, clip_coef=) as FusedAdam: unscale, clip and skip inside the
  kernel; torch.amp.GradScaler drives it.
* With dampening == 0 (the default) a new momentum buffer starts at zero, which gives exactly
  torch's first step (buf = grad) and stays right when that step is skipped for overflow.
"""
import torch

from ..ops import multi_tensor
from ._fused_common import FusedOptimizer, amp_scalars, gather
from .validation import check_sgd_hparams, check_unsupported_flags


class FusedSGD(FusedOptimizer):
    _dsfast_states_per_element = "momentum"   # a buffer where a group has momentum (optim/element_wise.py)

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, master_weights=False):
        check_sgd_hparams(lr, momentum, dampening, weight_decay, nesterov)
        self._set_master_weights(master_weights)
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)
            group.setdefault("maximize", False)

    def load_state_dict(self, state_dict):
        saved = {k: dict(v) for k, v in state_dict.get("state", {}).items()}
        super().load_state_dict(state_dict)
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(ids, params):
            state = self.state.get(p)
            if not state:
                continue
            master = self._uses_master(p)
            dtype = torch.float32 if master else p.dtype
            buf = state.get("momentum_buffer")
            if buf is not None:
                src = saved.get(pid, {}).get("momentum_buffer", buf) if master else buf
                state["momentum_buffer"] = src.to(device=p.device, dtype=dtype, copy=master,
                                                  memory_format=torch.contiguous_format)
            if master:
                src = saved.get(pid, {}).get("master_param")
                state["master_param"] = (src if src is not None else p.detach()).to(
                    device=p.device, dtype=torch.float32, copy=True, memory_format=torch.contiguous_format)
            else:
                state.pop("master_param", None)
        for group in self.param_groups:
            group.setdefault("nesterov", False)
            group.setdefault("maximize", False)

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale=None, found_inf=None, clip_coef=None, grads=None, out16=None):
        """One step; grad_scale / found_inf / clip_coef / grads / out16 as in FusedAdam.step."""
        loss, grad_scale, found_inf = self._begin_step(closure, grad_scale, found_inf)
        scalars = {}
        for gi, group in enumerate(self.param_groups):
            self._step_group(gi, group, self._group_hyperparameters(group), group,
                             grads[gi] if grads is not None else None, out16[gi] if out16 is not None else None,
                             (grad_scale, found_inf, clip_coef), scalars)
        return loss

    def _group_hyperparameters(self, group):
        """The group's validated (lr, momentum, dampening, weight_decay, nesterov); refuses flags it cannot honour."""
        hparams = check_sgd_hparams(group["lr"], group["momentum"], group["dampening"], group["weight_decay"],
                                    group["nesterov"])
        check_unsupported_flags(group, ("differentiable",))
        return hparams

    def _step_group(self, gi, group, hparams, members, grads, outs, amp, scalars):
        """Step members["params"] (all of `group`'s, or some) with `group`'s settings; amp: (grad_scale,
        found_inf, clip_coef); scalars: their device copies, made once per step."""
        lr, momentum, dampening, wd, nesterov = hparams

        def init_state(p, state, master):
            if master and "master_param" not in state:
                state["master_param"] = p.detach().to(torch.float32, copy=True,
                                                      memory_format=torch.contiguous_format)
            if momentum != 0.0 and state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32 if master else p.dtype,
                                                            memory_format=torch.contiguous_format)
                return dampening != 0.0  # zeros + (1 - 0) * g == g: only dampening needs the seed
            return False

        keys = ("momentum_buffer",) if momentum != 0.0 else ()
        buckets = gather(members, gi, self.state, self.master_weights, init_state, keys, grads, outs)
        for (device, _, _, _, first), (gs, ps, states, copies) in buckets.items():
            bufs = states[0] if states else []
            inv, flag, coef = amp_scalars(device, *amp, scalars)
            multi_tensor.backend(device).sgd_(gs, ps, bufs, copies, lr, momentum, dampening, wd, nesterov, first,
                                              inv, coef, flag, bool(group["maximize"]))
