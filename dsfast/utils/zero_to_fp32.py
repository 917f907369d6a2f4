"""deepspeed.utils.zero_to_fp32, where DeepSpeed programs import it from (the alias maps deepspeed.utils.X to
dsfast.utils.X). A re-export only: the work is dsfast.checkpoint.zero_to_fp32's, so utils/ depends on the
checkpoint layer at this one DeepSpeed path and nowhere else (tests/test_layers.py: COMPAT_PATHS)."""
from ..checkpoint.zero_to_fp32 import (LazyTensor, convert_zero_checkpoint_to_fp32_state_dict,  # noqa: F401
                                       convert_zero_checkpoint_to_state_dict, get_checkpoint_files,
                                       get_fp32_state_dict_from_zero_checkpoint, get_model_state_files,
                                       get_optim_files, load_state_dict_from_zero_checkpoint)

__all__ = ["get_checkpoint_files", "get_optim_files", "get_model_state_files",
           "get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_state_dict",
           "convert_zero_checkpoint_to_fp32_state_dict", "load_state_dict_from_zero_checkpoint"]
