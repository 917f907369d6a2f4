"""zero_force_ds_cpu_optimizer (default true): as DeepSpeed 0.19.8, a client optimizer with offload_optimizer must
be DeepSpeed's CPU Adam or Lion (dsfast's CPU kernels under those names), because any other optimizer steps the
host-resident states with slow per-tensor torch code. `"zero_force_ds_cpu_optimizer": false` lets it run."""
from ..optim.cpu_adam import CPUAdam

try:      # deepspeed.runtime.zero.utils' exception type, so `except ZeRORuntimeException` catches the refusal
    from ..runtime.zero.utils import ZeRORuntimeException as _DeepSpeedType
except ImportError:        # that module arrives with the DeepSpeed import paths (issue 31)
    _DeepSpeedType = RuntimeError


class ClientOptimizerOffloadError(_DeepSpeedType, ValueError):
    """A client optimizer other than DeepSpeed's CPU ones with offload_optimizer and zero_force_ds_cpu_optimizer."""


def _deepspeed_cpu_optimizers():
    kinds = [CPUAdam]
    try:
        from ..optim.cpu_lion import CPULion      # DeepSpeedCPULion, where dsfast has it
        kinds.append(CPULion)
    except ImportError:
        pass
    return tuple(kinds)


def check_offload_client_optimizer(cfg, optimizer):
    if cfg.zero_optimization.offload_optimizer_device == "none" or not cfg.zero_force_ds_cpu_optimizer:
        return
    if isinstance(optimizer, _deepspeed_cpu_optimizers()):
        return
    raise ClientOptimizerOffloadError(
        f"offload_optimizer with a client optimizer ({type(optimizer).__name__}): as DeepSpeed, only "
        "deepspeed.ops.adam.DeepSpeedCPUAdam (or DeepSpeedCPULion) is taken, since another optimizer steps the "
        "host-resident states slowly. Pass one of those, put the optimizer in the config's \"optimizer\" section, "
        "or set \"zero_force_ds_cpu_optimizer\": false to run this one anyway")
