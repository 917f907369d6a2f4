"""Public DeepSpeed 0.19.8 names that DeepSpeed's own unit tests (the yardstick, issue 31) import, each checked for
DeepSpeed's value or behaviour."""
import importlib


def test_runtime_swap_tensor_min_swappable_bytes_is_deepspeed_s_value():
    import dsfast
    from dsfast.runtime.swap_tensor import MIN_SWAPPABLE_BYTES
    assert MIN_SWAPPABLE_BYTES == 1024 ** 2   # deepspeed/runtime/swap_tensor/utils.py: MIN_AIO_BYTES
    assert dsfast.runtime.swap_tensor is importlib.import_module("dsfast.runtime.swap_tensor")


def test_runtime_zero_leaf_module_config_defaults_are_the_config_s():
    from dsfast.config.zero import ZeroConfig
    from dsfast.runtime.zero.leaf_module_config import (DEFAULT_LEAF_MODULE_CLASSES, DEFAULT_LEAF_MODULE_NAME_SUFFIXES,
                                                        DEFAULT_LEAF_MODULE_NAMES, DeepSpeedZeroLeafModuleConfig)
    leaf = ZeroConfig().leaf_module
    assert isinstance(leaf, DeepSpeedZeroLeafModuleConfig)
    assert (leaf.classes, leaf.names, leaf.name_suffixes) == (DEFAULT_LEAF_MODULE_CLASSES, DEFAULT_LEAF_MODULE_NAMES,
                                                              DEFAULT_LEAF_MODULE_NAME_SUFFIXES)
    assert DEFAULT_LEAF_MODULE_CLASSES == [   # DeepSpeed 0.19.8's list
        "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
        "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
        "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock"]
