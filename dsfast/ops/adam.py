"""deepspeed.ops.adam: DeepSpeedCPUAdam and FusedAdam, as programs import them (dsfast.optim's classes)."""
from ..optim.cpu_adam import CPUAdam as DeepSpeedCPUAdam
from ..optim.fused_adam import FusedAdam

__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
