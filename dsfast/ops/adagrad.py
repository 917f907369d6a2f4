"""deepspeed.ops.adagrad: DeepSpeedCPUAdagrad, as programs import it (dsfast.optim.CPUAdagrad)."""
from ..optim.cpu_adagrad import CPUAdagrad as DeepSpeedCPUAdagrad

__all__ = ["DeepSpeedCPUAdagrad"]
