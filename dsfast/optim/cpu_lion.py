"""CPULion: DeepSpeedCPULion's signature over dsfast's SIMD CPU kernels. Lion (Chen et al. 2023, "Symbolic
Discovery of Optimization Algorithms"):

    c = beta1 * m + (1 - beta1) * g;  p = p * (1 - lr * weight_decay) - lr * sign(c);  m = beta2 * m + (1 - beta2) * g

    opt = dsfast.optim.CPULion(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1)

Defaults are DeepSpeedCPULion's (lr 1e-3, betas (0.9, 0.999)); the paper recommends betas (0.9, 0.99). sign(0) is 0
(torch.sign's, the paper's): DeepSpeed's CPU kernel moves such an element by -lr. Parameters, gradients and
precisions as CPUAdam's; state per parameter: `exp_avg` (the momentum) and `step` (DeepSpeed's CPULion also
allocates an `exp_avg_sq` that it never reads; this class does not, and drops one from a loaded state dict).
"""
from . import _cpu_op
from ._cpu_one_state import OneStateCPUOptimizer
from .validation import check_lion_hparams


class CPULion(OneStateCPUOptimizer):
    STATE_KEY = "exp_avg"
    _dsfast_states_per_element = 1   # (optim/element_wise.py)

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0, fp32_optimizer_states=True, *,
                 maximize=False, isa="auto", stochastic_rounding=False):
        check_lion_hparams(lr, betas, weight_decay)
        defaults = dict(lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults, isa, fp32_optimizer_states, stochastic_rounding)

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("maximize", False)

    def load_state_dict(self, state_dict):
        saved = state_dict.get("state", {})
        kept = {k: ({key: v for key, v in st.items() if key != "exp_avg_sq"} if isinstance(st, dict) else st)
                for k, st in saved.items()}
        super().load_state_dict({**state_dict, "state": kept})

    def _hyperparameters(self, group):
        return check_lion_hparams(group["lr"], group["betas"], group["weight_decay"])

    def _table_kernel(self, native, table, hparams, grad_scale, seed):
        lr, (beta1, beta2), wd = hparams
        return native.lion_table_step(table, lr, beta1, beta2, wd, float(grad_scale), _cpu_op.num_threads(),
                                      self.isa, seed)

    def _kernel(self, hparams, params, grads, states, outs, steps, grad_scale, group_index, indices, seed):
        lr, (beta1, beta2), wd = hparams
        _cpu_op.call(_cpu_op.op().lion_step, group_index, indices, params, grads, states, outs, steps, lr, beta1,
                     beta2, wd, float(grad_scale), _cpu_op.num_threads(), self.isa, round_seed=seed)
