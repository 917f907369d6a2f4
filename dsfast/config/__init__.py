"""The ds_config schema: `load_config(...) -> DsConfig`, all validation in one place."""
from .batch import resolve_batch_sizes
from .ds_config import DsConfig
from .errors import DsConfigError
from .loader import load_config, parse_config, read_json_file
from .optimizer import OptimizerConfig
from .precision import Bf16Config, Fp16Config
from .scheduler import SCHEDULER_PARAMS, SchedulerConfig
from .zero import SUPPORTED_ZERO_STAGES, ZeroConfig

__all__ = ["DsConfig", "DsConfigError", "load_config", "parse_config", "read_json_file", "resolve_batch_sizes",
           "OptimizerConfig", "SchedulerConfig", "SCHEDULER_PARAMS", "Fp16Config", "Bf16Config", "ZeroConfig",
           "SUPPORTED_ZERO_STAGES"]
