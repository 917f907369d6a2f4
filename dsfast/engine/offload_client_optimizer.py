"""zero_force_ds_cpu_optimizer (default true): as DeepSpeed 0.19.8, a client optimizer with offload_optimizer must
be DeepSpeed's CPU Adam or Lion (dsfast's CPU kernels under those names), because any other optimizer steps the
host-resident states with slow per-tensor torch code. `"zero_force_ds_cpu_optimizer": false` lets it run."""
from ..optim.cpu_adam import CPUAdam
from ..optim.cpu_lion import CPULion
from ..runtime.zero.utils import ZeRORuntimeException

# DeepSpeedCPUAdam and DeepSpeedCPULion; DeepSpeed 0.19.8 takes no other (not even its CPU Adagrad)
DEEPSPEED_CPU_OPTIMIZERS = (CPUAdam, CPULion)


class ClientOptimizerOffloadError(ZeRORuntimeException, ValueError):
    """A client optimizer other than DeepSpeed's CPU ones with offload_optimizer and zero_force_ds_cpu_optimizer
    (DeepSpeed's ZeRORuntimeException, and a ValueError like dsfast's other refusals of a setup)."""


def check_offload_client_optimizer(cfg, optimizer):
    if cfg.zero_optimization.offload_optimizer_device == "none" or not cfg.zero_force_ds_cpu_optimizer:
        return
    if isinstance(optimizer, DEEPSPEED_CPU_OPTIMIZERS):
        return
    raise ClientOptimizerOffloadError(
        f"offload_optimizer with a client optimizer ({type(optimizer).__name__}): as DeepSpeed, only "
        "deepspeed.ops.adam.DeepSpeedCPUAdam (or DeepSpeedCPULion) is taken, since another optimizer steps the "
        "host-resident states slowly. Pass one of those, put the optimizer in the config's \"optimizer\" section, "
        "or set \"zero_force_ds_cpu_optimizer\": false to run this one anyway")
