"""deepspeed.runtime.config: the config class and its error under DeepSpeed's names."""
from ..config import DsConfig as DeepSpeedConfig, DsConfigError as DeepSpeedConfigError  # noqa: F401
