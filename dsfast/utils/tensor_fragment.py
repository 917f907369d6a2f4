"""deepspeed.utils.tensor_fragment: where DeepSpeed defines its safe_get_* / safe_set_* helpers (dsfast.utils has
them) and `fragment_address`, the record its ZeRO 1/2 checkpoints pickle for each parameter's piece of the flat
partition. Programs import it, with LossScaler and ZeroStageEnum, to allow those classes in torch.load's
weights_only unpickler (torch >= 2.6):
    torch.serialization.add_safe_globals([LossScaler, ZeroStageEnum, fragment_address])
dsfast reads DeepSpeed checkpoints with its own restricted unpickler and pickles no fragment_address itself."""
from dataclasses import dataclass

from . import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,  # noqa: F401
               safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
               safe_set_full_fp32_param, safe_set_full_grad, safe_set_full_optimizer_state,
               safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state,
               safe_update_full_grad_vectorized)


@dataclass
class fragment_address:   # noqa: N801  (DeepSpeed's name)
    """A parameter's piece of a rank's flat partition: `numel` elements from `start`."""
    numel: int
    start: int


__all__ = ["fragment_address", "safe_get_full_fp32_param", "safe_get_full_grad", "safe_get_full_optimizer_state",
           "safe_get_local_fp32_param", "safe_get_local_grad", "safe_get_local_optimizer_state",
           "safe_set_full_fp32_param", "safe_set_full_grad", "safe_set_full_optimizer_state",
           "safe_set_local_fp32_param", "safe_set_local_grad", "safe_set_local_optimizer_state",
           "safe_update_full_grad_vectorized"]
