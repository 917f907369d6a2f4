"""Public DeepSpeed 0.19.8 names that DeepSpeed's own unit tests (the yardstick, issue 31) import, each checked for
DeepSpeed's value or behaviour."""
import importlib
import os


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


def test_get_model_ckpt_name_for_rank_names_the_file_a_deepspeed_checkpoint_has():
    # DeepSpeed's tests find a tag folder's model states by this name; dsfast's DeepSpeed-checkpoint import reads the
    # same file (a checkpoint written by DeepSpeed 0.19.8 at stage 0-2 has mp_rank_00_model_states.pt)
    from dsfast.checkpoint.deepspeed_import import MODEL_STATES
    from dsfast.checkpoint.utils import get_model_ckpt_name_for_rank
    folder = os.path.join("ckpt", "global_step3")
    assert get_model_ckpt_name_for_rank(folder, "00") == os.path.join(folder, MODEL_STATES)
    assert get_model_ckpt_name_for_rank(folder, "01") == os.path.join(folder, "mp_rank_01_model_states.pt")
