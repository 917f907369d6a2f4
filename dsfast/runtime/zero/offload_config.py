"""deepspeed.runtime.zero.offload_config: the enums engine.offload_states() takes, and the offload sections' config
classes where DeepSpeed defines them (DeepSpeed's names)."""
from enum import Enum

from ...config.zero import OffloadOptimizerConfig as DeepSpeedZeroOffloadOptimizerConfig  # noqa: F401
from ...config.zero import OffloadParamConfig as DeepSpeedZeroOffloadParamConfig  # noqa: F401


class OffloadDeviceEnum(str, Enum):
    none = "none"
    cpu = "cpu"
    nvme = "nvme"


class OffloadStateTypeEnum(str, Enum):
    optim_states = "optim_states"                      # optimizer states (Adam's moments, momentum buffers)
    hp_params = "hp_params"                            # fp32 master weights
    lp_params = "lp_params"                            # the model's parameters (16-bit, or fp32 in fp32 runs)
    lp_grads = "lp_grads"                              # gradients (buckets, shards)
    contiguous_grad_buffer = "contiguous_grad_buffer"  # reduction staging and host-copy buffers
