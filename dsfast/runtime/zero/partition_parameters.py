"""deepspeed.runtime.zero.partition_parameters: the names programs import from it (ZeroParamStatus to test
`param.ds_status`, Init, GatheredParameters, register / unregister_external_parameter, is_zero_param,
ZeroParamType, the gather handles)."""
from ...zero import GatheredParameters, Init, ZeroParamStatus, register_external_parameter  # noqa: F401
from ...zero.params.hooks import unregister_external_parameter  # noqa: F401
from ...zero.params.ds_methods import AllGatherCoalescedHandle, MultipleAllGatherHandles  # noqa: F401
from ...zero.params.partitioned_param import ZeroParamType  # noqa: F401
from .utils import is_zero_param  # noqa: F401

import torch as _torch

partitioned_param_data_shape = [0]   # what a released parameter's .data holds (DeepSpeed's name)

# DeepSpeed's zero.Init wraps torch's tensor constructors through zero_wrapper_for_fp_tensor_constructor and keeps the
# originals as _orig_torch_*. dsfast's Init wraps no constructor (it partitions each module as it is registered), so
# these are only the names programs patch around it (Hugging Face's prevent_arange_dtype_change swaps the wrapper in
# and out): the wrapper returns the constructor unchanged.
_orig_torch_arange = _torch.arange
_orig_torch_empty = _torch.empty
_orig_torch_zeros = _torch.zeros
_orig_torch_ones = _torch.ones
_orig_torch_full = _torch.full


def zero_wrapper_for_fp_tensor_constructor(fn, target_fp_dtype=None, target_device=None):
    return fn


def get_accelerator():
    from ...accelerator import get_accelerator as accelerator
    return accelerator()
