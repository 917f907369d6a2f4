"""What frameworks and programs built on DeepSpeed reach for, in one process: deepspeed.launcher.runner
(accelerate launch --use_deepspeed), deepspeed.utils.logging.logger (Lightning), deepspeed.compression.helper and
engine.tput_timer (DeepSpeed-Chat), state_dict() placeholders of a ZeRO stage 3 model (accelerate's and
DeepSpeed-Chat's saves at stage 3). Each checked against DeepSpeed 0.19.8's documented behaviour (its source, read)."""
import copy
import io
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import dsfast

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO, **env})


# ------------------------------------------------------------------------------------------------ launcher.runner
@pytest.mark.parametrize("env, name", [({}, ".deepspeed_env"), ({"DS_ENV_FILE": "/tmp/my_env"}, "/tmp/my_env")])
def test_launcher_runner_names_as_accelerate_imports_them(env, name):
    r = _run("""
        import sys, dsfast
        sys.modules["deepspeed"] = dsfast
        from deepspeed.launcher.runner import DEEPSPEED_ENVIRONMENT_NAME, DLTS_HOSTFILE, main
        assert callable(main) and DLTS_HOSTFILE == "/job/hostfile"
        print(DEEPSPEED_ENVIRONMENT_NAME)
    """, **env)
    assert r.returncode == 0 and r.stdout.strip() == name, r.stderr


# ------------------------------------------------------------------------------------------------ utils.logging
def test_utils_logging_logger_is_the_program_logger_and_lightning_sets_its_level():
    import dsfast.utils.logging as ds_logging
    assert ds_logging.logger is dsfast.utils.logger and dsfast.utils.logging is ds_logging
    before = ds_logging.logger.level
    try:
        ds_logging.logger.setLevel(logging.WARNING)      # what Lightning's DeepSpeedStrategy() does
        assert ds_logging.get_current_level() == logging.WARNING
        assert ds_logging.should_log_le("error") and not ds_logging.should_log_le("info")
    finally:
        ds_logging.logger.setLevel(before)
    with pytest.raises(ValueError, match="'loud' is not a log level; use one of debug, info"):
        ds_logging.should_log_le("loud")


def test_deepspeed_utils_logging_as_an_attribute_after_import_deepspeed():
    r = _run("""
        import logging, sys, dsfast
        sys.modules["deepspeed"] = dsfast
        import deepspeed
        deepspeed.utils.logging.logger.setLevel(logging.ERROR)
        print(deepspeed.utils.logger.level)
    """)
    assert r.returncode == 0 and r.stdout.strip() == str(logging.ERROR), r.stderr


# ------------------------------------------------------------------------------------------------ compression.helper
def test_recursive_getattr_and_setattr_walk_dotted_module_paths():
    from dsfast.compression.helper import recursive_getattr, recursive_setattr
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU()), torch.nn.Linear(3, 1))
    assert recursive_getattr(model, "0.0") is model[0][0]
    assert recursive_getattr(model, "1.weight") is model[1].weight
    new = torch.nn.Linear(2, 3, bias=False)
    recursive_setattr(model, "0.0", new)
    assert model[0][0] is new
    recursive_setattr(model, "extra", torch.nn.Identity())     # a top-level name
    assert isinstance(model.extra, torch.nn.Identity)
    with pytest.raises(AttributeError, match=r"'0.5.weight': '0' has no attribute '5'"):
        recursive_getattr(model, "0.5.weight")
    with pytest.raises(AttributeError, match=r"'missing.fc': 'Sequential' has no attribute 'missing'"):
        recursive_setattr(model, "missing.fc.weight", new)


# ------------------------------------------------------------------------------------------------ tput_timer
def _engine(**extra):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1000,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, **extra}
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


def _micro_steps(engine, n):
    for _ in range(n):
        engine.backward(engine(torch.randn(2, 4)).sum())
        engine.step()


def test_engine_tput_timer_counts_micro_and_global_steps_and_epochs():
    engine = _engine()
    timer = engine.tput_timer
    assert type(timer).__name__ == "ThroughputTimer" and timer.batch_size == engine.train_batch_size() == 4
    assert timer.avg_samples_per_sec() == float("-inf")
    _micro_steps(engine, 8)
    assert (timer.micro_step_count, timer.global_step_count, timer.epoch_count) == (8, 4, 0)
    assert timer.avg_samples_per_sec() > 0           # steps 3 and 4 were timed (start_step 2)
    timer.update_epoch_count()                       # DeepSpeed-Chat calls it after each epoch
    assert (timer.epoch_count, timer.micro_step_count, timer.global_step_count) == (1, 0, 4)


def test_tput_timer_off_when_timers_throughput_is_disabled():
    engine = _engine(timers={"throughput": {"enabled": False, "synchronized": False}})
    _micro_steps(engine, 4)
    assert (engine.tput_timer.micro_step_count, engine.tput_timer.global_step_count) == (0, 0)


def test_throughput_timer_logs_every_steps_per_output_through_logging_fn():
    from dsfast.utils.timer import ThroughputTimer
    lines = []
    timer = ThroughputTimer(None, batch_size=8, start_step=0, steps_per_output=2, logging_fn=lines.append)
    for _ in range(4):
        timer.start()
        timer.stop(global_step=True)
    assert len(lines) == 2 and lines[0].startswith("epoch=0/micro_step=2/global_step=2, RunningAvgSamplesPerSec=")
    with pytest.raises(ValueError, match="monitor_memory=True"):
        ThroughputTimer(None, batch_size=1, monitor_memory=True)


# ------------------------------------------------------------------------------------------------ stage 3 state_dict
def _stage3_engine():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000, "optimizer": {"type": "SGD",
           "params": {"lr": 0.1}}, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    return dsfast.initialize(model=model, config=cfg, dist_init_required=False)[0]


def test_stage3_state_dict_gives_placeholders_on_every_rank_that_save_with_a_warning_into_a_file_that_refuses_to_load(
        tmp_path):
    from dsfast.zero.params.placeholders import PartitionedPlaceholder, zero3_placeholder_without_weights
    engine = _stage3_engine()
    sd = engine.module.state_dict()         # DeepSpeed's answer on every rank: DeepSpeed-Chat's save_hf_format
    assert list(sd) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert all(t.numel() == 0 and isinstance(t, PartitionedPlaceholder) for t in sd.values())
    assert copy.deepcopy(sd)["0.weight"].numel() == 0
    path = tmp_path / "pytorch_model.bin"
    with pytest.warns(UserWarning, match=r"saving placeholders, not weights: .*save_16bit_model"):
        torch.save(sd, path)                # works, as in DeepSpeed (the program goes on) ...
    no_weights = r"this file holds no weights for '0.weight' \(shape \[8, 4\], torch.float32\).*save_16bit_model"
    with pytest.raises(RuntimeError, match=no_weights):
        torch.load(path, weights_only=False)  # ... but the file never passes for a model
    with pytest.raises(Exception, match="zero3_placeholder_without_weights"):
        torch.load(path)                    # weights_only: torch's own refusal names the marker
    with torch.serialization.safe_globals([zero3_placeholder_without_weights]):
        with pytest.raises(RuntimeError, match=no_weights):
            torch.load(path)
    # a state_dict of placeholders loaded back: refused, not a silent no-op (both sides are empty) or zeroed shards
    placeholders = r"load_state_dict: 0.weight, 0.bias.* hold\(s\) placeholders, not weights.*GatheredParameters"
    with pytest.raises(RuntimeError, match=placeholders):
        engine.module.load_state_dict(sd)
    with pytest.raises(RuntimeError, match=placeholders):
        engine.load_module_state_dict(sd)     # dsfast's own stage-3 loader
    with dsfast.zero.GatheredParameters(list(engine.module.parameters())):     # gathered: real tensors
        whole = engine.module.state_dict()
    assert whole["0.weight"].shape == (8, 4) and type(whole["0.weight"]) is torch.Tensor
    torch.save(whole, path)
    engine.load_module_state_dict({k: v * 2 for k, v in torch.load(path).items()})   # whole weights load back
    with dsfast.zero.GatheredParameters(list(engine.module.parameters())):
        assert all(torch.equal(v, 2 * whole[k]) for k, v in engine.module.state_dict().items())


# ------------------------------------------------------------------------------------------------ wall-clock timers
def test_synchronized_wall_clock_timer_times_named_phases(capsys, monkeypatch):
    import types

    import dsfast
    from dsfast.utils import timer as timer_mod
    from dsfast.utils.timer import NoopTimer, SynchronizedWallClockTimer
    clock = iter([10.0, 10.25, 11.0, 11.5, 20.0, 20.125])     # seconds: intervals of 250, 500 and 125 ms
    monkeypatch.setattr(timer_mod, "time", types.SimpleNamespace(time=lambda: next(clock)))
    timers = SynchronizedWallClockTimer()
    timers("forward").start()
    timers("forward").stop(record=True)
    timers("forward").start()
    timers("forward").stop(record=True)
    assert timers.has("forward") and not timers.has("backward")
    assert timers("forward").elapsed(reset=False) == pytest.approx(750.0)
    assert timers.get_mean(["forward", "backward"], reset=False) == {"forward": pytest.approx(375.0)}
    timers("step").start()
    timers("step").stop()
    timers.log(["forward", "step", "backward"], normalizer=2)
    assert "time (ms) | forward: 375.00 | step: 62.50" in capsys.readouterr().out
    assert timers("forward").elapsed() == 0.0                   # log() reset them
    with pytest.raises(RuntimeError, match="timer 'step' is not running"):
        timers("step").stop()
    with pytest.raises(ValueError, match="normalizer=0"):
        timers.log(["step"], normalizer=0)
    noop = NoopTimer()
    noop("x").start()
    noop("x").stop()
    assert noop("x").elapsed() == 0.0 and noop.get_timers() == {} and noop.log(["x"]) is None
    assert dsfast.is_compile_supported() is True


# ------------------------------------------------------------------------------------------------ logger.warning_once, nvtx
def test_logger_warning_once_logs_a_message_once(capsys):
    from dsfast.utils import logger
    from dsfast.utils.logging import warning_once
    logger.warning_once("the sky is falling (warning_once test)")
    warning_once("the sky is falling (warning_once test)")
    logger.warning_once("the sky is falling again (warning_once test)")
    out = capsys.readouterr().out
    assert out.count("the sky is falling (warning_once test)") == 1 and "falling again" in out
    assert "test_framework_names.py" in out          # the caller's location, as logger.warning gives


def test_instrument_w_nvtx_wraps_each_call_in_a_named_range(monkeypatch):
    from dsfast.accelerator import get_accelerator
    from dsfast.utils.nvtx import instrument_w_nvtx
    ranges = []
    acc = get_accelerator()
    monkeypatch.setattr(acc, "range_push", lambda msg, *a, **k: ranges.append(("push", msg)))
    monkeypatch.setattr(acc, "range_pop", lambda *a, **k: ranges.append(("pop",)))

    @instrument_w_nvtx
    def reduce_bucket(x, scale=1):
        """docs kept"""
        if x < 0:
            raise ValueError("negative")
        return x * scale

    assert reduce_bucket(3, scale=2) == 6 and reduce_bucket.__doc__ == "docs kept"
    with pytest.raises(ValueError):
        reduce_bucket(-1)
    name = "test_instrument_w_nvtx_wraps_each_call_in_a_named_range.<locals>.reduce_bucket"
    assert ranges == [("push", name), ("pop",), ("push", name), ("pop",)]   # popped on the error too
