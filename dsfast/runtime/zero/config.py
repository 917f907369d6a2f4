"""deepspeed.runtime.zero.config: the zero_optimization section's models under DeepSpeed's names. They are dsfast's
own validated models (dsfast.config.zero), so what one builds here is what initialize() would run with: the same
keys, aliases (stage3_*), defaults (offload pin_memory true) and errors. One difference: `device` is the plain
string ("none" | "cpu" | "nvme"), which compares equal to DeepSpeed's OffloadDeviceEnum members."""
from enum import IntEnum

from ...config.zero import LeafModuleConfig as DeepSpeedZeroLeafModuleConfig  # noqa: F401
from ...config.zero import OffloadOptimizerConfig as DeepSpeedZeroOffloadOptimizerConfig
from ...config.zero import OffloadParamConfig as DeepSpeedZeroOffloadParamConfig
from ...config.zero import ZeroConfig as DeepSpeedZeroConfig
from .offload_config import OffloadDeviceEnum

ZERO_OPTIMIZATION = "zero_optimization"


class ZeroStageEnum(IntEnum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


def get_zero_config(param_dict):
    """The DeepSpeedZeroConfig of a whole ds_config dict (its zero_optimization section; {} when absent). The
    old boolean form ("zero_optimization": true) is stage 1, as DeepSpeed reads it."""
    if not isinstance(param_dict, dict):
        raise TypeError(f"get_zero_config expects the ds_config as a dict, got {type(param_dict).__name__}")
    section = param_dict.get(ZERO_OPTIMIZATION, {})
    if isinstance(section, bool):
        section = {"stage": 1 if section else 0}
    return DeepSpeedZeroConfig.model_validate(section)


__all__ = ["DeepSpeedZeroConfig", "DeepSpeedZeroOffloadOptimizerConfig", "DeepSpeedZeroOffloadParamConfig",
           "ZeroStageEnum", "OffloadDeviceEnum", "ZERO_OPTIMIZATION", "get_zero_config"]
