"""deepspeed.runtime.precision_config: the fp16 and bf16 config sections as classes (DeepSpeedFP16Config,
DeepSpeedBF16Config: dsfast's own section models, pydantic like DeepSpeed's, with the same fields, defaults and
checks) and the readers that build them from a whole ds_config dict."""
from ..config.precision import Bf16Config as DeepSpeedBF16Config
from ..config.precision import Fp16Config as DeepSpeedFP16Config

BFLOAT16 = "bf16"
BFLOAT16_OLD = "bfloat16"   # the older spelling, read where "bf16" is absent
FP16 = "fp16"


def _section(param_dict, *keys):
    if not isinstance(param_dict, dict):
        raise TypeError(f"expected the ds_config as a dict, got {type(param_dict).__name__}")
    for key in keys:
        if param_dict.get(key) is not None:
            section = param_dict[key]
            if not isinstance(section, dict):
                raise TypeError(f'ds_config "{key}" must be an object (a dict), got {type(section).__name__}')
            return section
    return {}


def get_bfloat16_config(param_dict):
    """The "bf16" section (or "bfloat16" without one) of a ds_config dict, validated; defaults when absent."""
    return DeepSpeedBF16Config(**_section(param_dict, BFLOAT16, BFLOAT16_OLD))


def get_float16_config(param_dict):
    """The "fp16" section of a ds_config dict, validated; defaults when absent."""
    return DeepSpeedFP16Config(**_section(param_dict, FP16))
