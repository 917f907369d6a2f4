"""deepspeed.runtime.config: the config class and its error under DeepSpeed's names."""
from ..config import DsConfigError as DeepSpeedConfigError  # noqa: F401


# ---- DeepSpeed's section readers over a ds_config dict (programs read values the way DeepSpeed does) ------------
def get_gradient_clipping(param_dict):
    """The ds_config dict's "gradient_clipping", or DeepSpeed 0.19.8's default 1.0 when it is absent."""
    if not isinstance(param_dict, dict):
        raise TypeError(f"get_gradient_clipping expects the ds_config as a dict, got {type(param_dict).__name__}")
    return param_dict.get("gradient_clipping", 1.0)


# --- ds-unit-tests: DeepSpeedConfig(dict or path) and DeepSpeed's optimizer name constants ---
from ..config.deepspeed_config import DeepSpeedConfig  # noqa: F401,E402

# the config's optimizer.type names DeepSpeed knows (lower case, as DeepSpeed compares them)
ADAGRAD_OPTIMIZER = "adagrad"
ADAM_OPTIMIZER = "adam"
ADAMW_OPTIMIZER = "adamw"
LAMB_OPTIMIZER = "lamb"
MUADAM_OPTIMIZER = "muadam"
MUADAMW_OPTIMIZER = "muadamw"
MUSGD_OPTIMIZER = "musgd"
LION_OPTIMIZER = "lion"
MUON_OPTIMIZER = "muon"
DEEPSPEED_OPTIMIZERS = [ADAGRAD_OPTIMIZER, ADAM_OPTIMIZER, ADAMW_OPTIMIZER, LAMB_OPTIMIZER, MUADAM_OPTIMIZER,
                        MUADAMW_OPTIMIZER, MUSGD_OPTIMIZER, LION_OPTIMIZER, MUON_OPTIMIZER]
TORCH_ADAM_PARAM = "torch_adam"            # optimizer.params key: use torch's Adam
ADAM_W_MODE = "adam_w_mode"                # optimizer.params key: decoupled weight decay for "Adam"
ADAM_W_MODE_DEFAULT = True
# --- end ds-unit-tests ---
