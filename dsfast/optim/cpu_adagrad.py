"""CPUAdagrad: DeepSpeedCPUAdagrad's signature over dsfast's SIMD CPU kernels (torch.optim.Adagrad's update with
lr_decay 0 and initial_accumulator_value 0: sum += g^2; p -= lr * g / (sqrt(sum) + eps), weight decay as L2).

    opt = dsfast.optim.CPUAdagrad(model.parameters(), lr=1e-2, eps=1e-10, weight_decay=0.0)

Parameters, gradients and precisions as CPUAdam's: fp32 parameters with fp32 states; gradients fp32, bf16 or fp16
read in place; bf16 / fp16 parameters with fp32 states, or states in their own dtype with fp32_optimizer_states=False;
`step(fp16_param_groups=...)` writes the updated parameters into 16-bit tensors in the same pass. State per parameter
is DeepSpeed's layout: `exp_avg_sq` (the sum of squared gradients) and `step`. A torch.optim.Adagrad state dict
(`sum`) loads too. amsgrad (which DeepSpeedCPUAdagrad accepts and ignores) is refused.
"""
from . import _cpu_op
from ._cpu_one_state import OneStateCPUOptimizer
from .validation import check_adagrad_hparams


class CPUAdagrad(OneStateCPUOptimizer):
    STATE_KEY = "exp_avg_sq"
    _dsfast_states_per_element = 1   # (optim/element_wise.py)

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False, fp32_optimizer_states=True, *,
                 maximize=False, isa="auto", stochastic_rounding=False):
        check_adagrad_hparams(lr, eps, weight_decay)
        _refuse_amsgrad(amsgrad)
        defaults = dict(lr=lr, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults, isa, fp32_optimizer_states, stochastic_rounding)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)

    def load_state_dict(self, state_dict):
        # torch.optim.Adagrad keeps the sum as 'sum'; DeepSpeed and this class as 'exp_avg_sq'
        saved = state_dict.get("state", {})
        renamed = {k: ({("exp_avg_sq" if key == "sum" else key): v for key, v in st.items()}
                       if isinstance(st, dict) and "sum" in st and "exp_avg_sq" not in st else st)
                   for k, st in saved.items()}
        super().load_state_dict({**state_dict, "state": renamed})

    def _hyperparameters(self, group):
        _refuse_amsgrad(group.get("amsgrad", False))
        return check_adagrad_hparams(group["lr"], group["eps"], group["weight_decay"], group.get("lr_decay", 0.0),
                                     group.get("initial_accumulator_value", 0.0))

    def _table_kernel(self, native, table, hparams, grad_scale, seed):
        lr, eps, wd = hparams
        return native.adagrad_table_step(table, lr, eps, wd, float(grad_scale), _cpu_op.num_threads(), self.isa,
                                         seed)

    def _kernel(self, hparams, params, grads, states, outs, steps, grad_scale, group_index, indices, seed):
        lr, eps, wd = hparams
        _cpu_op.call(_cpu_op.op().adagrad_step, group_index, indices, params, grads, states, outs, steps, lr, eps, wd,
                     float(grad_scale), _cpu_op.num_threads(), self.isa, round_seed=seed)


def _refuse_amsgrad(amsgrad):
    if amsgrad:
        raise ValueError("amsgrad=True has no meaning for Adagrad (DeepSpeedCPUAdagrad accepts and ignores it); "
                         "set amsgrad=False")
