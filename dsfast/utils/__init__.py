"""DeepSpeed's `deepspeed.utils` helpers for reading (and setting) what the engine holds for a parameter.

    safe_get_full_fp32_param(param)                  the whole fp32 master of `param`
    safe_get_full_grad(param)                        its whole reduced gradient (averaged over ranks, unscaled
                                                     by the fp16 loss scale only through the engine's factor)
    safe_get_full_optimizer_state(param, "exp_avg")  a whole per-element optimizer state
    safe_get_local_fp32_param / _grad / _optimizer_state: this rank's piece only (1-D; empty if none)
    safe_set_full_fp32_param(param, value) / _grad / _optimizer_state(param, value, key), safe_set_local_*:
    write them (the local ones take exactly this rank's piece); safe_update_full_grad_vectorized(params, fn)
    sets each gradient to fn(its full gradient, param).
Under ZeRO the "full" getters are collectives: every rank must call them, in the same order, as in DeepSpeed. The
setters are not (each rank writes its own piece of the value it is given). A set fp32 parameter reaches the
model's 16-bit copy at the next step, as in DeepSpeed. A parameter the engine does not train (frozen, or not
given to initialize) returns None, as DeepSpeed does, and a setter leaves it alone with a warning.
"""


def _owner(param):
    """The engine's state owner of `param` (dsfast.zero.owner.StateOwner), None for one it does not train; its
    overlapped step (offload_optimizer.overlap_step) done, so that what is read or written is the updated value."""
    owner = getattr(param, "_dsfast_owner", None)
    if owner is not None:
        owner.settle()
    return owner


def _tell(param, method, *args):
    """The owner writes `param`'s value; DeepSpeed ignores a parameter no engine trains: say so, then do that."""
    owner = _owner(param)
    if owner is None:
        logger.warning(f"deepspeed.utils.safe_{method}: the parameter (shape {tuple(param.shape)}) is not trained "
                       "by any engine (frozen, or not given to initialize): nothing was set")
        return
    getattr(owner, method)(param, *args)


def safe_get_full_fp32_param(param):
    owner = _owner(param)
    return None if owner is None else owner.full_fp32_param(param)


def safe_get_full_grad(param):
    owner = _owner(param)
    return None if owner is None else owner.full_grad(param)


def safe_get_full_optimizer_state(param, optim_state_key):
    owner = _owner(param)
    return None if owner is None else owner.full_optimizer_state(param, optim_state_key)


def safe_get_local_fp32_param(param):
    owner = _owner(param)
    return None if owner is None else owner.local_fp32_param(param)


def safe_get_local_grad(param):
    owner = _owner(param)
    return None if owner is None else owner.local_grad(param)


def safe_get_local_optimizer_state(param, optim_state_key):
    owner = _owner(param)
    return None if owner is None else owner.local_optimizer_state(param, optim_state_key)


def safe_set_full_fp32_param(param, value):
    _tell(param, "set_full_fp32_param", value)


def safe_set_full_grad(param, value):
    _tell(param, "set_full_grad", value)


def safe_set_full_optimizer_state(param, value, optim_state_key):
    _tell(param, "set_full_optimizer_state", value, optim_state_key)


def safe_set_local_fp32_param(param, value):
    _tell(param, "set_local_fp32_param", value)


def safe_set_local_grad(param, value):
    _tell(param, "set_local_grad", value)


def safe_set_local_optimizer_state(param, value, optim_state_key):
    _tell(param, "set_local_optimizer_state", value, optim_state_key)


def safe_update_full_grad_vectorized(param_list, update_func):
    """Each parameter's gradient becomes update_func(its full gradient, param). A collective (it reads the full
    gradients): every rank calls it with the same list."""
    for p in param_list:
        if getattr(p, "_dsfast_owner", None) is not None:
            safe_set_full_grad(p, update_func(safe_get_full_grad(p), p))


from . import logging  # noqa: E402  (deepspeed.utils.logging.logger: Lightning sets its level)
from .log import log_dist, logger  # noqa: E402  (deepspeed.utils.logger / log_dist)
from .nvtx import instrument_w_nvtx  # noqa: E402
from .on_device import OnDevice  # noqa: E402
from .repeating_loader import RepeatingLoader  # noqa: E402
from .z3_leaf_module import (get_z3_leaf_modules, set_z3_leaf_module, set_z3_leaf_modules,  # noqa: E402
                             set_z3_leaf_modules_by_name, set_z3_leaf_modules_by_suffix, unset_z3_leaf_modules,
                             z3_leaf_module, z3_leaf_parameter)

__all__ = ["safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "safe_set_full_fp32_param", "safe_set_full_grad", "safe_set_full_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_grad", "safe_set_local_optimizer_state",
           "safe_update_full_grad_vectorized", "logger",
           "log_dist", "OnDevice", "set_z3_leaf_modules", "unset_z3_leaf_modules", "get_z3_leaf_modules",
           "z3_leaf_module", "z3_leaf_parameter", "set_z3_leaf_module", "set_z3_leaf_modules_by_name",
           "set_z3_leaf_modules_by_suffix", "RepeatingLoader", "instrument_w_nvtx"]
