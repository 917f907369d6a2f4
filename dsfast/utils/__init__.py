"""DeepSpeed's `deepspeed.utils` helpers for reading (and setting) what the engine holds for a parameter.

    safe_get_full_fp32_param(param)                  the whole fp32 master of `param`
    safe_get_full_grad(param)                        its whole reduced gradient (averaged over ranks, unscaled
                                                     by the fp16 loss scale only through the engine's factor)
    safe_get_full_optimizer_state(param, "exp_avg")  a whole per-element optimizer state
    safe_get_local_fp32_param / _grad / _optimizer_state: this rank's piece only (1-D; empty if none)
Under ZeRO the "full" variants are collectives: every rank must call them, in the same order, as in DeepSpeed.
A parameter the engine does not train (frozen, or not given to initialize) returns None, as DeepSpeed does.
"""


def _owner(param):
    return getattr(param, "_dsfast_owner", None)


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


__all__ = ["safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state"]
