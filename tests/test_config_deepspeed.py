"""Optional: our schema against DeepSpeed's own pydantic models (skips when deepspeed is not importable).

Run with the DeepSpeed venv: DS_ACCELERATOR=cpu /work/venv-ds/bin/python -m pytest tests/test_config_deepspeed.py
"""
import pytest

from dsfast.config.precision import Bf16Config, Fp16Config
from dsfast.config.zero import OffloadOptimizerConfig, OffloadParamConfig, ZeroConfig

# Deliberate differences, each with its reason.
KNOWN_DIFFERENCES = {
    # REFERENCE.md §3.2 documents false (DeepSpeed <= 0.16); 0.19 defaults to true. Only matters for offload.
    ("DeepSpeedZeroOffloadOptimizerConfig", "pin_memory"),
    ("DeepSpeedZeroOffloadParamConfig", "pin_memory"),
    # ours maps the deprecated key onto gather_16bit_weights_on_model_save, so None means "not given"
    ("DeepSpeedZeroConfig", "stage3_gather_fp16_weights_on_model_save"),
}


def _pairs():
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,
                                                       DeepSpeedZeroOffloadParamConfig)
    return [(DeepSpeedZeroConfig, ZeroConfig), (DeepSpeedZeroOffloadOptimizerConfig, OffloadOptimizerConfig),
            (DeepSpeedZeroOffloadParamConfig, OffloadParamConfig), (DeepSpeedFP16Config, Fp16Config),
            (DeepSpeedBF16Config, Bf16Config)]


def _plain(value):
    value = getattr(value, "value", value)          # enums
    return value.model_dump() if hasattr(value, "model_dump") else value


def test_every_deepspeed_key_is_known_with_the_same_default_and_alias():
    for theirs, ours in _pairs():
        for name, field in theirs.model_fields.items():
            assert name in ours.model_fields, f"{theirs.__name__}.{name} missing from {ours.__name__}"
            mine = ours.model_fields[name]
            assert field.alias == mine.alias, (theirs.__name__, name)
            if (theirs.__name__, name) in KNOWN_DIFFERENCES:
                continue
            a = _plain(field.get_default(call_default_factory=True))
            b = _plain(mine.get_default(call_default_factory=True))
            if name == "leaf_module":   # DeepSpeed lists HF MoE classes by default; they only matter at stage 3
                continue
            assert a == b or str(a) == str(b), (theirs.__name__, name, a, b)


def test_torch_autocast_keys_default_and_dtype_spellings_match_deepspeed():
    pytest.importorskip("deepspeed")
    import torch
    from deepspeed.runtime import constants as C
    from deepspeed.runtime.config import DtypeEnum, get_torch_autocast_dtype

    from dsfast.config.precision import TorchAutocastConfig
    assert {C.TORCH_AUTOCAST_ENABLED, C.TORCH_AUTOCAST_DTYPE, C.TORCH_AUTOCAST_LOWER_PRECISION_SAFE_MODULES} == \
        set(TorchAutocastConfig.model_fields)
    assert TorchAutocastConfig().enabled is C.TORCH_AUTOCAST_ENABLED_DEFAULT is False
    assert TorchAutocastConfig().dtype is None and get_torch_autocast_dtype({}) is None
    as_torch = {"fp16": torch.float16, "bf16": torch.bfloat16}
    for member in (DtypeEnum.fp16, DtypeEnum.bf16):
        for spelling in member._all_values:      # the torch dtype itself, then DeepSpeed's strings
            theirs = get_torch_autocast_dtype({"torch_autocast": {"dtype": spelling}})
            assert as_torch[TorchAutocastConfig(dtype=spelling).dtype] == theirs, spelling
