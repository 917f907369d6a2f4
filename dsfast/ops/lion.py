"""deepspeed.ops.lion: DeepSpeedCPULion, as programs import it (dsfast.optim.CPULion). DeepSpeed's FusedLion (the
CUDA kernel) is not implemented: importing it raises an ImportError that says so."""
from ..optim.cpu_lion import CPULion as DeepSpeedCPULion

__all__ = ["DeepSpeedCPULion"]


def __getattr__(name):
    if name == "FusedLion":
        raise ImportError("deepspeed.ops.lion.FusedLion (DeepSpeed's CUDA Lion kernel) is not implemented by dsfast; "
                          "use DeepSpeedCPULion with zero_optimization.offload_optimizer.device \"cpu\", or a Lion "
                          "optimizer of your own passed to initialize(optimizer=...)")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
