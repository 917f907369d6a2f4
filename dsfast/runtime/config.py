"""deepspeed.runtime.config: the config class and its error under DeepSpeed's names."""
from ..config import DsConfig as DeepSpeedConfig, DsConfigError as DeepSpeedConfigError  # noqa: F401


# ---- DeepSpeed's section readers over a ds_config dict (programs read values the way DeepSpeed does) ------------
def get_gradient_clipping(param_dict):
    """The ds_config dict's "gradient_clipping", or DeepSpeed 0.19.8's default 1.0 when it is absent."""
    if not isinstance(param_dict, dict):
        raise TypeError(f"get_gradient_clipping expects the ds_config as a dict, got {type(param_dict).__name__}")
    return param_dict.get("gradient_clipping", 1.0)
