"""Public DeepSpeed 0.19.8 names that DeepSpeed's own unit tests (the yardstick, issue 31) import, each checked for
DeepSpeed's value or behaviour."""
import importlib


def test_runtime_swap_tensor_min_swappable_bytes_is_deepspeed_s_value():
    import dsfast
    from dsfast.runtime.swap_tensor import MIN_SWAPPABLE_BYTES
    assert MIN_SWAPPABLE_BYTES == 1024 ** 2   # deepspeed/runtime/swap_tensor/utils.py: MIN_AIO_BYTES
    assert dsfast.runtime.swap_tensor is importlib.import_module("dsfast.runtime.swap_tensor")
