"""torch.optim-compatible optimizers over dsfast's kernels."""
import importlib

_LAZY = {
    "CPUAdam": "dsfast.optim.cpu_adam",
    "CPUAdamW": "dsfast.optim.cpu_adam",
    "CPUAdam8bit": "dsfast.optim.cpu_adam8bit",
    "CPUAdamW8bit": "dsfast.optim.cpu_adam8bit",
    "CPUSGD": "dsfast.optim.cpu_sgd",
    "CPUAdagrad": "dsfast.optim.cpu_adagrad",
    "CPULion": "dsfast.optim.cpu_lion",
    "adam_flat_step": "dsfast.optim.cpu_adam",   # flat-buffer entry points (ZeRO/offload partitions)
    "sgd_flat_step": "dsfast.optim.cpu_sgd",
    "FusedAdam": "dsfast.optim.fused_adam",
    "FusedSGD": "dsfast.optim.fused_sgd",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dsfast.optim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = list(_LAZY)
