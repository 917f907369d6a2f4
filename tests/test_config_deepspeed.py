"""Our schema against DeepSpeed's own pydantic models: every key, its alias and its default.

Always against DeepSpeed 0.19.8's fields recorded in tests/data/deepspeed_config_defaults.json, and against the live
models too when deepspeed is importable (e.g. DS_ACCELERATOR=cpu /work/venv-ds/bin/python -m pytest this file).
"""
import pytest

from _deepspeed_cases import CONFIG_PAIRS, GOLDEN_DEEPSPEED, config_fields, deepspeed_traces, load_golden, model_class

# Deliberate differences, each with its reason.
KNOWN_DIFFERENCES = {
    # ours maps the deprecated key onto gather_16bit_weights_on_model_save, so None means "not given"
    ("DeepSpeedZeroConfig", "stage3_gather_fp16_weights_on_model_save"),
}


def assert_schema_covers(theirs_by_model):
    assert sorted(theirs_by_model) == sorted(theirs[1] for theirs, _ in CONFIG_PAIRS)
    for theirs_name, ours_ref in ((t[1], o) for t, o in CONFIG_PAIRS):
        theirs, ours = theirs_by_model[theirs_name], config_fields(model_class(ours_ref))
        for name, field in theirs.items():
            assert name in ours, f"{theirs_name}.{name} missing from {ours_ref[1]}"
            assert field["alias"] == ours[name]["alias"], (theirs_name, name)
            if (theirs_name, name) not in KNOWN_DIFFERENCES:
                assert field["default"] == ours[name]["default"], (theirs_name, name, field, ours[name])


def test_every_deepspeed_key_is_known_with_the_same_default_and_alias_recorded():
    golden = load_golden("config_defaults")
    assert sum(len(fields) for fields in golden.values()) > 50      # the whole of each model, not a stub
    assert_schema_covers(golden)


def test_every_deepspeed_key_is_known_with_the_same_default_and_alias_when_installed():
    deepspeed = pytest.importorskip("deepspeed")
    theirs = deepspeed_traces("config_defaults")
    assert_schema_covers(theirs)
    if deepspeed.__version__ == GOLDEN_DEEPSPEED:
        assert theirs == load_golden("config_defaults"), "stale golden file: rerun tests/data/make_deepspeed_goldens.py"


def test_known_differences_are_real_fields():
    golden = load_golden("config_defaults")
    for model, name in KNOWN_DIFFERENCES:
        assert name in golden[model], (model, name)


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
