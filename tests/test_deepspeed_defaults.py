"""Defaults that changed in DeepSpeed 0.19.x, as 0.19.8 resolves them: gradient_clipping 1.0 when omitted (since
0.19.3), offload pin_memory true (since 0.19.5), the process group's timeout 10 minutes or DEEPSPEED_TIMEOUT minutes.

Compared with DeepSpeed 0.19.8's own resolution of the same configs, recorded in
tests/data/deepspeed_runtime_defaults.json (and live when deepspeed is importable); a user's explicit value wins.
"""
import datetime

import pytest
import torch

import dsfast
from _deepspeed_cases import (GOLDEN_DEEPSPEED, deepspeed_traces, dsfast_growth, dsfast_runtime_defaults,
                               load_golden)
from dsfast.comm.init import _timeout, default_timeout
from dsfast.config import load_config


def _ours_like_theirs(theirs):
    return {k: v for k, v in theirs.items() if k != "loss_scale_growth"}


def test_runtime_defaults_match_deepspeed_recorded():
    assert dsfast_runtime_defaults() == _ours_like_theirs(load_golden("runtime_defaults"))


def test_runtime_defaults_match_deepspeed_when_installed():
    deepspeed = pytest.importorskip("deepspeed")
    theirs = deepspeed_traces("runtime_defaults")
    assert dsfast_runtime_defaults() == _ours_like_theirs(theirs)
    if deepspeed.__version__ == GOLDEN_DEEPSPEED:
        assert theirs == load_golden("runtime_defaults"), "stale golden: rerun tests/data/make_deepspeed_goldens.py"


# ------------------------------------------------------------------------------------------------ clipping
def _train_one_step(cfg_extra):
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    ref = torch.nn.Linear(6, 3)
    ref.load_state_dict(model.state_dict())
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **cfg_extra}
    engine, _, _, _ = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                                        dist_init_required=False)
    x, y = torch.randn(4, 6) * 10, torch.randn(4, 3) * 10     # a gradient norm far above 1
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    engine.step()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    return engine, ref


@pytest.mark.parametrize("given, max_norm", [(None, 1.0), (0.0, None), (0.5, 0.5)])
def test_the_engine_clips_at_1_when_the_key_is_omitted_and_an_explicit_value_wins(given, max_norm):
    engine, ref = _train_one_step({} if given is None else {"gradient_clipping": given})
    assert engine.gradient_clipping() == (1.0 if given is None else given)
    raw_norm = torch.linalg.vector_norm(torch.cat([p.grad.reshape(-1) for p in ref.parameters()]))
    assert raw_norm > 10       # the case clips for real
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    for a, b in zip(engine.module.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_clipping_errors_name_the_key():
    for bad in (-1, float("inf")):
        with pytest.raises(dsfast.config.DsConfigError, match="gradient_clipping"):
            load_config({"train_batch_size": 1, "gradient_clipping": bad})


# ------------------------------------------------------------------------------------------------ pin_memory
def test_deprecated_cpu_offload_use_pin_memory_false_is_honoured():
    # DeepSpeed 0.19.8 ignores the deprecated key (pins anyway); dsfast lets the user's explicit value win
    z = load_config({"train_batch_size": 1, "zero_optimization": {
        "stage": 3, "cpu_offload": True, "cpu_offload_param": True, "cpu_offload_use_pin_memory": False}},
        log_ignored=False).zero_optimization
    assert (z.offload_optimizer.pin_memory, z.offload_param.pin_memory) == (False, False)


@pytest.mark.parametrize("section, argument, expected", [
    (None, False, False), (None, True, True),
    ({"device": "cpu"}, False, True),                            # the section's default (true) replaces the argument
    ({"device": "cpu", "pin_memory": False}, True, False)])
def test_zero_init_takes_pin_memory_from_the_offload_param_section_as_deepspeed(section, argument, expected):
    cfg = {"train_batch_size": 1, "zero_optimization": {"stage": 3, **({"offload_param": section} if section else {})}}
    assert dsfast.zero.Init(config_dict_or_path=cfg, pin_memory=argument, enabled=False).pin is expected


# ------------------------------------------------------------------------------------------------ timeout
def test_timeout_default_and_overrides():
    assert default_timeout({}) == datetime.timedelta(minutes=10)
    assert default_timeout({"DEEPSPEED_TIMEOUT": "30"}) == datetime.timedelta(minutes=30)
    # dsfast's own variable (seconds) wins over DeepSpeed's; an explicit argument over both
    assert default_timeout({"DEEPSPEED_TIMEOUT": "30", "DSFAST_TIMEOUT_S": "90"}) == datetime.timedelta(seconds=90)
    assert _timeout(5) == datetime.timedelta(seconds=5)
    assert _timeout(datetime.timedelta(minutes=2)) == datetime.timedelta(minutes=2)


@pytest.mark.parametrize("env", [{"DEEPSPEED_TIMEOUT": "1.5"}, {"DEEPSPEED_TIMEOUT": "0"},
                                 {"DEEPSPEED_TIMEOUT": "ten"}, {"DSFAST_TIMEOUT_S": "-1"},
                                 {"DSFAST_TIMEOUT_S": "nan"}])
def test_a_bad_timeout_variable_is_an_error_naming_it(env):
    (name, value), = env.items()
    with pytest.raises(ValueError, match=rf"{name}='{value}': must be a (whole )?number of (minutes|seconds) > 0"):
        default_timeout(env)


# ------------------------------------------------------------------------------------------------ loss scale growth
def test_the_dynamic_scale_grows_one_step_earlier_than_deepspeed_as_documented():
    # a deliberate difference (README): after loss_scale_window clean steps, as DeepSpeed's docs say; DeepSpeed
    # 0.19.8 itself doubles one step later. Everything else of the scaler matches (test_loss_scaler.py's traces).
    theirs, ours = load_golden("runtime_defaults")["loss_scale_growth"], dsfast_growth()
    assert ours["......."] == [256.0, 256.0, 512.0, 512.0, 512.0, 1024.0, 1024.0]
    for pattern, scales in theirs.items():
        assert ours[pattern][:-1] == scales[1:], pattern
