"""`python -m dsfast.config ds_config.json --explain` (dsfast/config/explain.py): every effective value with its
origin. The origins follow DeepSpeed 0.19.8's rules: its defaults (gradient_clipping 1.0 since 0.19.3, offload
pin_memory true since 0.19.5, checked against the recorded trace in test_deepspeed_defaults.py), its batch rule
(train = micro x accumulation x world), "auto" filled in by the framework."""
import json
import os
import subprocess
import sys

import pytest

from dsfast.config import DsConfig, DsConfigError
from dsfast.config.explain import DEFAULT_CHANGES, explain

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rows(cfg, world_size=1, env=None):
    return {k: (v, o) for k, v, o in explain(cfg, world_size=world_size, env=env or {})}


def test_user_alias_default_and_changed_defaults():
    got = rows({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {
        "stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}}})
    assert got["train_micro_batch_size_per_gpu"] == (4, "user")
    assert got["zero_optimization.param_persistence_threshold"] == \
        (0, "user (as 'stage3_param_persistence_threshold')")
    assert got["zero_optimization.reduce_bucket_size"] == (500_000_000, "default: DeepSpeed 0.19.8")
    assert got["gradient_clipping"] == (1.0, "default: DeepSpeed 0.19.8 (since 0.19.3; 0.0 before)")
    assert got["zero_optimization.offload_optimizer.pin_memory"] == \
        (True, "default: DeepSpeed 0.19.8 (since 0.19.5; False before)")
    assert got["zero_optimization.offload_param"] == (None, "default: DeepSpeed 0.19.8")
    assert got["checkpoint.timeout_s"][1].startswith("dsfast's own key")
    assert got["(environment) process group timeout [s]"] == \
        (600.0, "default: DeepSpeed 0.19.8 (10 minutes; DEEPSPEED_TIMEOUT minutes overrides)")
    assert set(DEFAULT_CHANGES) - set(got) == {"zero_optimization.offload_param.pin_memory"}     # no section


def test_an_explicit_value_is_the_user_s_even_when_it_equals_the_default():
    got = rows({"train_batch_size": 8, "gradient_clipping": 1.0, "fp16": {"enabled": True, "loss_scale_window": 50}})
    assert got["gradient_clipping"] == (1.0, "user")
    value, origin = got["fp16.loss_scale_window"]
    assert value == 50 and origin.startswith("user; dsfast: the dynamic scale doubles after loss_scale_window")


@pytest.mark.parametrize("cfg, world, want", [
    ({"train_batch_size": 16, "gradient_accumulation_steps": 2}, 2,
     {"train_batch_size": (16, "user"), "gradient_accumulation_steps": (2, "user"),
      "train_micro_batch_size_per_gpu": (4, "derived: 16 / (accumulation 2 x world 2)")}),
    ({"train_micro_batch_size_per_gpu": 3}, 4,
     {"train_batch_size": (12, "derived: micro 3 x accumulation 1 x world 4"),
      "gradient_accumulation_steps": (1, "default: 1 (DeepSpeed's rule when it cannot be derived)")}),
    ({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3}, 2,
     {"gradient_accumulation_steps": (4, "derived: 24 / (micro 3 x world 2)")}),
])
def test_the_batch_triple_says_which_values_were_derived(cfg, world, want):
    got = rows(cfg, world_size=world)
    for key, expected in want.items():
        assert got[key] == expected, key


def test_auto_values_and_deprecated_keys():
    got = rows({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
                "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "bf16": {"enabled": "auto"},
                "zero_optimization": {"stage": 2, "cpu_offload": True}})
    assert got["train_batch_size"] == ("auto", "auto: the framework fills it in")
    assert got["gradient_clipping"] == (1.0, "auto: the framework fills it in (without it: this value)")
    assert got["optimizer.params.lr"][1].startswith("auto:") and got["bf16.enabled"][1].startswith("auto:")
    assert got["zero_optimization.offload_optimizer.device"] == ("cpu", "derived: from a deprecated key")
    assert got["zero_optimization.offload_optimizer.pin_memory"] == (True, "derived: from a deprecated key")


def test_every_top_level_key_is_explained():
    keys = {k.split(".")[0] for k in rows({"train_batch_size": 1})}
    assert set(DsConfig.model_fields) <= keys


@pytest.mark.parametrize("env, want", [({"DEEPSPEED_TIMEOUT": "3"}, (180.0, "user (environment DEEPSPEED_TIMEOUT)")),
                                       ({"DSFAST_TIMEOUT_S": "90", "DEEPSPEED_TIMEOUT": "3"},
                                        (90.0, "user (environment DSFAST_TIMEOUT_S)"))])
def test_the_timeout_says_which_variable_set_it(env, want):
    assert rows({"train_batch_size": 1}, env=env)["(environment) process group timeout [s]"] == want


def test_a_bad_config_is_the_usual_error():
    with pytest.raises(DsConfigError, match="gradient_clipping"):
        explain({"train_batch_size": 1, "gradient_clipping": -1})


def _cli(tmp_path, cfg, *args, **env):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return subprocess.run([sys.executable, "-m", "dsfast.config", str(path), "--explain", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO, **env})


def test_cli_prints_every_value_with_its_origin(tmp_path):
    r = _cli(tmp_path, {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0}, "--world-size", "2")
    assert r.returncode == 0, r.stderr
    assert "(world size 2): every effective value and its origin" in r.stdout
    lines = r.stdout.splitlines()
    assert any(l.split() == ["gradient_clipping", "=", "0.0", "user"] for l in lines), r.stdout
    assert any(l.split()[:3] == ["train_batch_size", "=", "4"] and "derived: micro 2 x accumulation 1 x world 2" in l
               for l in lines), r.stdout


@pytest.mark.parametrize("cfg, env, message", [
    ({"train_batch_size": 1, "gradient_clipng": 1}, {}, "gradient_clipng: unknown key; did you mean"),
    ("{not json", {}, "is not valid JSON"),
    ({"train_batch_size": 1}, {"DEEPSPEED_TIMEOUT": "soon"}, "DEEPSPEED_TIMEOUT='soon': must be a whole number"),
])
def test_cli_errors_exit_1_and_name_the_problem(tmp_path, cfg, env, message):
    r = _cli(tmp_path, cfg, **env)
    assert r.returncode == 1 and message in r.stderr, (r.stdout, r.stderr)
