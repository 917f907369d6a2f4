"""deepspeed.runtime.zero.utils: ZeRORuntimeException, is_zero_param (a ZeRO stage 3 partitioned parameter carries
ds_id, as DeepSpeed's do) and the optimizers ZeRO is tested with (is_zero_supported_optimizer)."""
import torch


class ZeRORuntimeException(Exception):
    """DeepSpeed's error type for a ZeRO misuse found at run time."""


def is_zero_param(parameter):
    """True for a parameter partitioned by ZeRO stage 3 (zero.Init or an engine at stage 3)."""
    return torch.is_tensor(parameter) and hasattr(parameter, "ds_id")


def _supported_optimizers():
    """The list, made once on first use (importing this module loads no optimizer); programs may append to it."""
    found = globals().get("ZERO_SUPPORTED_OPTIMIZERS")
    if found is None:
        from ...ops.adam import DeepSpeedCPUAdam, FusedAdam
        from ...optim.cpu_adam import CPUAdamW
        found = globals()["ZERO_SUPPORTED_OPTIMIZERS"] = [torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad,
                                                          DeepSpeedCPUAdam, CPUAdamW, FusedAdam]
    return found


def is_zero_supported_optimizer(optimizer):
    """Whether `optimizer`'s exact class is one ZeRO is tested with (else zero_allow_untested_optimizer)."""
    return type(optimizer) in _supported_optimizers()


def __getattr__(name):
    if name == "ZERO_SUPPORTED_OPTIMIZERS":
        return _supported_optimizers()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ZeRORuntimeException", "is_zero_param", "is_zero_supported_optimizer"]
