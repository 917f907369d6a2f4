"""ds_config schema: defaults equal DeepSpeed's, batch resolution, and every error path names its key."""
import argparse
import json

import pytest

from dsfast.config import SUPPORTED_ZERO_STAGES, DsConfig, DsConfigError, load_config

BASE = {"train_batch_size": 8}


def cfg(**kw):
    return load_config({**BASE, **kw})


def problems(data, **kw):
    with pytest.raises(DsConfigError) as info:
        load_config(data, **kw)
    return info.value, str(info.value)


# ------------------------------------------------------------------------------------------------ defaults
def test_defaults_match_deepspeed():
    c = cfg()
    assert c.gradient_clipping == 1.0 and c.steps_per_print == 10     # 1.0 since DeepSpeed 0.19.3
    assert c.wall_clock_breakdown is False and c.prescale_gradients is False
    assert c.gradient_predivide_factor == 1.0 and c.dataloader_drop_last is False
    assert c.zero_allow_untested_optimizer is False and c.zero_force_ds_cpu_optimizer is True
    f = c.fp16
    assert (f.enabled, f.auto_cast, f.loss_scale, f.initial_scale_power, f.loss_scale_window, f.hysteresis,
            f.consecutive_hysteresis, f.min_loss_scale, f.fp16_master_weights_and_grads) == \
        (False, False, 0.0, 16, 1000, 2, False, 1.0, False)
    assert f.dynamic and f.initial_scale == 65536.0
    assert c.bf16.enabled is False and c.bf16.immediate_grad_update is False
    z = c.zero_optimization
    assert z.stage == 0 and c.zero_stage == 0
    assert z.contiguous_gradients is True and z.reduce_scatter is True
    assert z.reduce_bucket_size == 500_000_000 and z.allgather_bucket_size == 500_000_000
    assert z.overlap_comm is False and z.overlap_comm_resolved is False   # resolved on the object, as DeepSpeed
    assert z.prefetch_bucket_size == 50_000_000 and z.param_persistence_threshold == 100_000
    assert z.max_live_parameters == 1_000_000_000 and z.max_reuse_distance == 1_000_000_000
    assert z.sub_group_size == 1_000_000_000 and z.load_from_fp32_weights is True
    assert z.offload_optimizer_device == "none" and z.offload_param_device == "none"
    assert c.checkpoint.tag_validation == "Warn" and c.checkpoint.load_universal is False
    assert c.optimizer is None and c.scheduler is None
    assert c.precision == "fp32"


def test_precision_helper_and_bfloat16_alias():
    assert cfg(fp16={"enabled": True}).precision == "fp16"
    assert cfg(bf16={"enabled": True}).precision == "bf16"
    assert cfg(bfloat16={"enabled": True}).precision == "bf16"
    _, msg = problems({**BASE, "bf16": {"enabled": True}, "bfloat16": {"enabled": True}})
    assert "bfloat16" in msg


def test_offload_defaults_validated_even_when_unused():
    from dsfast.config.zero import OffloadOptimizerConfig, OffloadParamConfig
    o = OffloadOptimizerConfig()
    assert (o.device, o.buffer_count, o.pin_memory, o.ratio) == ("none", 4, True, 1.0)   # pinned: 0.19.5
    p = OffloadParamConfig()
    assert (p.device, p.buffer_count, p.buffer_size, p.max_in_cpu, p.pin_memory) == \
        ("none", 5, 100_000_000, 1_000_000_000, True)


@pytest.mark.parametrize("section", ["offload_optimizer", "offload_param"])
def test_offload_device_and_nvme_path_errors_name_the_section(section):
    from dsfast.config.zero import OffloadOptimizerConfig, OffloadParamConfig
    base = {"train_batch_size": 1}
    with pytest.raises(DsConfigError, match=rf"zero_optimization\.{section}: device \"nvme\" needs \"nvme_path\""):
        load_config({**base, "zero_optimization": {"stage": 3, section: {"device": "nvme"}}})
    with pytest.raises(DsConfigError, match=rf"zero_optimization\.{section}\.device: must be one of 'none', 'cpu', "
                                            rf"'nvme'( or 'auto' \(dsfast picks .*\))? \(got 'gpu'\)"):
        load_config({**base, "zero_optimization": {"stage": 3, section: {"device": "gpu"}}})
    model = {"offload_optimizer": OffloadOptimizerConfig, "offload_param": OffloadParamConfig}[section]
    assert model(device="CPU").device == "cpu" and model(device=None).device == "none"


# ------------------------------------------------------------------------------------------------ batch sizes
@pytest.mark.parametrize("given, world, expected", [
    ({"train_batch_size": 32}, 4, (32, 8, 1)),
    ({"train_micro_batch_size_per_gpu": 4}, 2, (8, 4, 1)),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, (32, 4, 4)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 2, (32, 8, 2)),
    ({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5}, 3, (45, 3, 5)),
    ({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2}, 4,
     (24, 3, 2)),
])
def test_batch_resolution(given, world, expected):
    c = load_config(given, world_size=world)
    assert (c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps) == expected
    assert c.world_size == world


def test_batch_inconsistent_prints_all_three_and_world_size():
    err, msg = problems({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 3,
                         "gradient_accumulation_steps": 2}, world_size=2)
    for text in ("train_batch_size=8", "train_micro_batch_size_per_gpu=3", "gradient_accumulation_steps=2",
                 "world size=2", "3 * 2 * 2 = 12 != 8"):
        assert text in msg
    assert err.problems[0][0] == "train_batch_size"


def test_batch_not_divisible_by_world():
    _, msg = problems({"train_batch_size": 8}, world_size=3)
    assert "train_batch_size=8" in msg and "world size=3" in msg and "not set" in msg


def test_batch_none_given():
    _, msg = problems({})
    assert "train_batch_size or train_micro_batch_size_per_gpu" in msg
    _, msg = problems({"gradient_accumulation_steps": 4})
    assert "gradient_accumulation_steps=4 alone" in msg


def test_batch_bounds_and_auto():
    _, msg = problems({"train_batch_size": 0})
    assert "train_batch_size: " in msg and "greater than or equal to 1" in msg
    _, msg = problems({"train_batch_size": "auto"})
    assert "train_batch_size" in msg and "'auto'" in msg


# ------------------------------------------------------------------------------------------------ unknown keys
def test_unknown_top_level_key_suggests():
    err, msg = problems({**BASE, "gradient_clipng": 1.0})
    assert "gradient_clipng: unknown key; did you mean 'gradient_clipping'?" in msg
    assert err.problems == [("gradient_clipng", "unknown key; did you mean 'gradient_clipping'?")]


@pytest.mark.parametrize("section, bad, good", [
    ("fp16", "loss_scale_windw", "loss_scale_window"),
    ("bf16", "enable", "enabled"),
    ("zero_optimization", "reduce_bucket_sz", "reduce_bucket_size"),
    ("checkpoint", "tag_validaton", "tag_validation"),
])
def test_unknown_nested_key_names_full_path(section, bad, good):
    _, msg = problems({**BASE, section: {bad: 1}})
    assert f"{section}.{bad}: unknown key; did you mean '{good}'?" in msg


def test_unknown_deeply_nested_key():
    _, msg = problems({**BASE, "zero_optimization": {"offload_optimizer": {"devise": "none"}}})
    assert "zero_optimization.offload_optimizer.devise: unknown key; did you mean 'device'?" in msg


def test_unknown_optimizer_and_scheduler_params():
    _, msg = problems({**BASE, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decy": 0.1}}})
    assert "optimizer.params.weight_decy: unknown key; did you mean 'weight_decay'?" in msg
    _, msg = problems({**BASE, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_rl": 1e-3}}})
    assert "scheduler.params.warmup_max_rl: unknown key; did you mean 'warmup_max_lr'?" in msg


def test_all_problems_reported_together():
    err, msg = problems({**BASE, "fp16": {"hysteresis": 0}, "steps_per_print": 0, "wall_clock": True})
    paths = [p for p, _ in err.problems]
    assert paths == ["fp16.hysteresis", "steps_per_print", "wall_clock"]
    assert "3 problems" in msg


# ------------------------------------------------------------------------------------------------ precision
def test_fp16_and_bf16_both_enabled():
    _, msg = problems({**BASE, "fp16": {"enabled": True}, "bf16": {"enabled": True}})
    assert "mutually exclusive" in msg


@pytest.mark.parametrize("key, value, text", [
    ("loss_scale", -1, "greater than or equal to 0"),
    ("loss_scale", float("inf"), "finite"),
    ("hysteresis", 0, "greater than or equal to 1"),
    ("loss_scale_window", 0, "must be >= 1 with dynamic loss scaling"),
    ("min_loss_scale", 0, "must be a finite number > 0 with dynamic loss scaling"),
    ("initial_scale_power", 100, "less than or equal to 63"),
    ("enabled", "yes please", "valid boolean"),
])
def test_fp16_bounds_name_the_key(key, value, text):
    _, msg = problems({**BASE, "fp16": {"enabled": True, key: value}})
    assert f"fp16.{key}: " in msg and text in msg


def test_fp16_floor_above_initial_scale():
    _, msg = problems({**BASE, "fp16": {"enabled": True, "min_loss_scale": 2 ** 20}})
    assert "fp16.min_loss_scale" in msg and "initial_scale_power" in msg


def test_static_loss_scale():
    c = cfg(fp16={"enabled": True, "loss_scale": 128})
    assert not c.fp16.dynamic and not c.dynamic_loss_scale


def test_apex_amp_rejected():
    _, msg = problems({**BASE, "amp": {"enabled": True, "opt_level": "O2"}})
    assert "amp.enabled" in msg and "apex" in msg
    assert cfg(amp={"enabled": False, "opt_level": "O2"}).amp.enabled is False


OFFLOAD = {"offload_optimizer": {"device": "cpu"}}


@pytest.mark.parametrize("section,keys,zero", [
    ("bf16", {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, {"stage": 1}),
    ("bf16", {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, {"stage": 3, **OFFLOAD}),
    ("bf16", {"bf16_master_weights_and_grads": True}, {"stage": 2, **OFFLOAD}),
    ("fp16", {"fp16_master_weights_and_grads": True}, {"stage": 2, **OFFLOAD}),
])
def test_16bit_master_keys_accepted_where_deepspeed_accepts_them(section, keys, zero):
    c = cfg(**{section: {"enabled": True, **keys}}, zero_optimization=zero)
    for k, v in keys.items():
        assert getattr(getattr(c, section), k) is v
    assert getattr(cfg().bf16, "bf16_master_weights_and_grads") is False   # DeepSpeed 0.19.8's defaults
    assert cfg().bf16.bf16_optimizer_states is False and cfg().fp16.fp16_master_weights_and_grads is False


@pytest.mark.parametrize("section,keys,zero,words", [
    ("bf16", {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, {"stage": 0},
     ["bf16.bf16_master_weights_and_grads", "stage 1, 2 or 3 (stage is 0)"]),
    ("bf16", {"bf16_optimizer_states": True}, {"stage": 2},
     ["bf16.bf16_optimizer_states", "needs bf16.bf16_master_weights_and_grads=true"]),
    ("bf16", {"bf16_master_weights_and_grads": True}, {"stage": 2},
     ["bf16.bf16_master_weights_and_grads", "offload_optimizer.device", "bf16_optimizer_states to true"]),
    ("fp16", {"fp16_master_weights_and_grads": True}, {"stage": 1},
     ["fp16.fp16_master_weights_and_grads", "offload_optimizer.device"]),
    ("fp16", {"fp16_master_weights_and_grads": True}, {"stage": 0, **OFFLOAD}, ["stage"]),
    # dsfast's own limit: 16-bit masters may be the parameter shards themselves, never put in a swap file
    ("bf16", {"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
     {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}},
     ["bf16.bf16_master_weights_and_grads", '"nvme" is not supported', "fp32 masters on NVMe"]),
])
def test_16bit_master_keys_refused_where_deepspeed_refuses_them(section, keys, zero, words):
    _, msg = problems({**BASE, section: {"enabled": True, **keys}, "zero_optimization": zero})
    for w in words:
        assert w in msg, (w, msg)


def test_16bit_masters_need_the_model_in_that_dtype():
    _, msg = problems({**BASE, "bf16": {"enabled": False, "bf16_master_weights_and_grads": True,
                                        "bf16_optimizer_states": True}, "zero_optimization": {"stage": 2}})
    assert 'needs "bf16": {"enabled": true}' in msg
    _, msg = problems({**BASE, "fp16": {"fp16_master_weights_and_grads": True},
                       "zero_optimization": {"stage": 2, **OFFLOAD}})
    assert 'needs "fp16": {"enabled": true}' in msg


def test_fp32_optimizer_states_resolved_as_deepspeeds_engine():
    from dsfast.config.master_precision import cpu_adam_fp32_states
    adam = {"type": "AdamW", "params": {"lr": 1e-3}}
    assert cpu_adam_fp32_states(cfg(optimizer=adam)) is True
    off = {"type": "AdamW", "params": {"lr": 1e-3, "fp32_optimizer_states": False}}
    assert cpu_adam_fp32_states(cfg(optimizer=off)) is False          # accepted (fp32 masters: no effect)
    on = {"type": "AdamW", "params": {"lr": 1e-3, "fp32_optimizer_states": True}}
    c = cfg(optimizer=on, bf16={"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True},
            zero_optimization={"stage": 2})
    assert cpu_adam_fp32_states(c) is False                            # bf16_optimizer_states overrides it


def test_torch_autocast_defaults_and_dtype_spellings():
    t = cfg().torch_autocast
    assert (t.enabled, t.dtype, t.lower_precision_safe_modules) == (False, None, None)
    for given, want in (("bfloat16", "bf16"), ("bf16", "bf16"), ("torch.bfloat16", "bf16"), ("BF16", "bf16"),
                        ("fp16", "fp16"), ("float16", "fp16"), ("half", "fp16"), ("torch.float16", "fp16")):
        assert cfg(torch_autocast={"enabled": True, "dtype": given}).torch_autocast.dtype == want, given
    mods = ["torch.nn.Linear", "torch.nn.modules.conv.Conv2d", "mypkg.layers.MyLinear"]
    assert cfg(torch_autocast={"lower_precision_safe_modules": mods}).torch_autocast.lower_precision_safe_modules \
        == mods


@pytest.mark.parametrize("section, path, text", [
    ({"dtype": "fp32"}, "torch_autocast.dtype", "lower precision"),
    ({"dtype": "int8"}, "torch_autocast.dtype", 'must be "bf16"'),
    ({"lower_precision_safe_modules": "torch.nn.Linear"}, "torch_autocast.lower_precision_safe_modules",
     "must be a list"),
    ({"lower_precision_safe_modules": ["torch.nn.Linear", "Linear"]},
     "torch_autocast.lower_precision_safe_modules[1]", "class name with its module"),
    ({"lower_precision_safe_modules": [3]}, "torch_autocast.lower_precision_safe_modules[0]", "got 3"),
    ({"enabeld": True}, "torch_autocast.enabeld", "did you mean 'enabled'"),
])
def test_torch_autocast_errors_name_the_key(section, path, text):
    _, msg = problems({**BASE, "torch_autocast": {"enabled": True, **section}})
    assert f"{path}:" in msg and text in msg, msg


def test_torch_autocast_with_fp16_is_refused_with_bf16_allowed():
    _, msg = problems({**BASE, "fp16": {"enabled": True}, "torch_autocast": {"enabled": True}})
    assert "torch_autocast.enabled:" in msg and '"fp16"' in msg
    c = cfg(bf16={"enabled": True}, torch_autocast={"enabled": True, "dtype": "bf16"})   # DeepSpeed 0.19 allows it
    assert c.precision == "bf16" and c.torch_autocast.enabled
    assert cfg(fp16={"enabled": True}, torch_autocast={"enabled": False}).precision == "fp16"


# ------------------------------------------------------------------------------------------------ ZeRO
def test_zero_stage_above_supported_is_an_error_not_stage0():
    assert SUPPORTED_ZERO_STAGES == frozenset({0, 1, 2, 3})
    _, msg = problems({**BASE, "zero_optimization": {"stage": 4}})
    assert "zero_optimization.stage: Input should be less than or equal to 3 (got 4)" in msg
    for stage in (1, 2, 3):
        assert cfg(zero_optimization={"stage": stage}).zero_stage == stage


def test_partial_optimizer_offload_is_refused_at_stage3():
    _, msg = problems({**BASE, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu",
                                                                                      "ratio": 0.5}}})
    assert "offload_optimizer.ratio" in msg and "not supported by dsfast" in msg


def test_zero_bool_forms():
    assert cfg(zero_optimization=True).zero_stage == 1   # true = stage 1, as DeepSpeed (seed 000's config)
    assert cfg(zero_optimization=False).zero_stage == 0


def test_nvme_offload_runs_for_optimizer_states_at_stages_1_to_3_and_parameters_at_stage_3():
    for stage in (1, 2, 3):
        c = cfg(zero_optimization={"stage": stage, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}})
        assert c.zero_optimization.offload_optimizer_device == "nvme"
    c = cfg(zero_optimization={"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp"}},
            aio={"queue_depth": 8})
    assert c.zero_optimization.offload_param_device == "nvme"
    assert any(n.startswith("aio.queue_depth is ignored: each swap thread") for n in c.ignored_settings())
    for stage in (0, 1, 2):      # DeepSpeed ignores offload_param below stage 3 (tests/unit TestNoOptim[0])
        c = cfg(zero_optimization={"stage": stage, "offload_param": {"device": "nvme", "nvme_path": "/tmp"}})
        assert c.zero_optimization.offload_param_device == "none"
        assert f"zero_optimization.offload_param is ignored at ZeRO stage {stage}: parameters are offloaded only " \
               "at stage 3, as in DeepSpeed" in c.ignored_settings()
    _, msg = problems({**BASE, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})
    assert 'zero_optimization.offload_param: device "nvme" needs "nvme_path"' in msg
    _, msg = problems({**BASE, "zero_optimization": {"stage": 3, "offload_param": {
        "device": "nvme", "nvme_path": "/tmp", "buffer_count": 1}}})
    assert "zero_optimization.offload_param.buffer_count: NVMe offload of parameters needs at least 2" in msg
    _, msg = problems({**BASE, "zero_optimization": {"stage": 2, "offload_optimizer": {
        "device": "nvme", "nvme_path": "/tmp", "buffer_count": 0}}})
    assert "zero_optimization.offload_optimizer.buffer_count: NVMe offload needs at least 1 host buffer" in msg


def test_zero_stage_out_of_range():
    _, msg = problems({**BASE, "zero_optimization": {"stage": 4}})
    assert "zero_optimization.stage" in msg and "less than or equal to 3" in msg


def test_zero_stage3_aliases_and_conflicts():
    c = cfg(zero_optimization={"stage3_prefetch_bucket_size": 123, "param_persistence_threshold": 7})
    assert c.zero_optimization.prefetch_bucket_size == 123
    assert c.zero_optimization.param_persistence_threshold == 7
    _, msg = problems({**BASE, "zero_optimization": {"prefetch_bucket_size": 1, "stage3_prefetch_bucket_size": 2}})
    assert "both set" in msg
    _, msg = problems({**BASE, "zero_optimization": {"reduce_bucket_size": 0}})
    assert "zero_optimization.reduce_bucket_size" in msg


def test_zero_offload_validation():
    _, msg = problems({**BASE, "zero_optimization": {"offload_optimizer": {"device": "gpu"}}})
    assert "zero_optimization.offload_optimizer.device" in msg and "'cpu'" in msg
    _, msg = problems({**BASE, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    assert "zero_optimization.offload_optimizer" in msg and "stage 1, 2 or 3" in msg
    _, msg = problems({**BASE, "zero_optimization": {"cpu_offload": True, "offload_optimizer": {"device": "cpu"}}})
    assert "cpu_offload" in msg and "both set" in msg


# ------------------------------------------------------------------------------------------------ optimizer
def test_optimizer_types_case_insensitive_and_adamw_mode():
    c = cfg(optimizer={"type": "Adam", "params": {"lr": 1.5e-4}})
    assert c.optimizer.type == "adam" and c.optimizer.adamw_mode is True   # DeepSpeed's default
    assert c.optimizer.torch_kwargs() == {"lr": 1.5e-4, "betas": (0.9, 0.999), "eps": 1e-8,
                                          "weight_decay": 0.0, "bias_correction": True}
    assert cfg(optimizer={"type": "adam", "params": {"adam_w_mode": False}}).optimizer.adamw_mode is False
    assert cfg(optimizer={"type": "ADAMW", "params": {"adam_w_mode": False}}).optimizer.adamw_mode is True
    s = cfg(optimizer={"type": "SGD", "params": {"lr": 0.001, "momentum": 0.9}}).optimizer
    assert s.type == "sgd" and s.torch_kwargs()["momentum"] == 0.9 and s.adamw_mode is False


@pytest.mark.parametrize("kind", ["Lamb", "OneBitAdam", "MuAdam", "RMSprop"])
def test_optimizer_not_supported_yet(kind):
    _, msg = problems({**BASE, "optimizer": {"type": kind}})
    assert "optimizer.type" in msg and "not supported by dsfast yet" in msg


def test_optimizer_unknown_type_suggests():
    _, msg = problems({**BASE, "optimizer": {"type": "AdamWW"}})
    assert "optimizer.type: unknown optimizer type 'AdamWW'" in msg and "did you mean" in msg


@pytest.mark.parametrize("params, path, text", [
    ({"lr": -0.1}, "optimizer.params.lr", "greater than or equal to 0"),
    ({"betas": [0.9, 1.5]}, "optimizer.params.betas", "[0, 1)"),
    ({"betas": [0.9]}, "optimizer.params.betas", "two numbers"),
    ({"eps": -1}, "optimizer.params.eps", ""),
    ({"weight_decay": -0.01}, "optimizer.params.weight_decay", ""),
    ({"amsgrad": True}, "optimizer.params.amsgrad", "not supported"),
    ({"max_grad_norm": 1.0}, "optimizer.params.max_grad_norm", "gradient_clipping"),
])
def test_optimizer_params_bounds(params, path, text):
    _, msg = problems({**BASE, "optimizer": {"type": "AdamW", "params": params}})
    assert f"{path}: " in msg and text in msg


def test_sgd_nesterov_needs_momentum():
    _, msg = problems({**BASE, "optimizer": {"type": "sgd", "params": {"nesterov": True}}})
    assert "optimizer.params" in msg and "nesterov" in msg


# ------------------------------------------------------------------------------------------------ scheduler
def test_scheduler_required_params_named():
    _, msg = problems({**BASE, "scheduler": {"type": "WarmupDecayLR", "params": {}}})
    assert "scheduler.params.total_num_steps: required key is missing" in msg
    err, msg = problems({**BASE, "scheduler": {"type": "OneCycle"}})
    assert [p for p, _ in err.problems] == ["scheduler.params.cycle_min_lr", "scheduler.params.cycle_max_lr"]


def test_scheduler_type_unknown_and_case():
    assert cfg(scheduler={"type": "warmupcosinelr", "params": {"total_num_steps": 10}}).scheduler.type == \
        "WarmupCosineLR"
    _, msg = problems({**BASE, "scheduler": {"type": "WarmupLinearLR"}})
    assert "scheduler.type" in msg and "did you mean" in msg


def test_unknown_warmup_type_warns_and_uses_log_as_deepspeed():
    # DeepSpeed 0.19.8 accepts any warmup_type, warns, and warms up on the log curve (its check is exact: "Linear"
    # is log too); a config must give the same learning rates on both
    for kind, hint in (("cosine", False), ("Linear", True)):
        with pytest.warns(UserWarning, match="warmup_type") as caught:
            c = cfg(scheduler={"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_type": kind}})
        assert c.scheduler.params.warmup_type == "log"
        assert ('did you mean "linear"' in str(caught[0].message)) == hint
    assert cfg(scheduler={"type": "WarmupLR", "params": {"warmup_type": "linear"}}).scheduler.params.warmup_type \
        == "linear"


# ------------------------------------------------------------------------------------------------ other keys
def test_other_top_level_keys_accepted_or_rejected():
    c = cfg(checkpoint={"tag_validation": "FAIL"}, data_types={"grad_accum_dtype": "fp32"},
            communication_data_type="bf16", dump_state=True, zero_allow_untested_optimizer=True,
            zero_force_ds_cpu_optimizer=False, activation_checkpointing={"partition_activations": True},
            flops_profiler={"enabled": True}, tensorboard={"enabled": True, "output_path": "x"},
            wandb={"enabled": False}, csv_monitor={"enabled": False}, comms_logger={"enabled": True},
            amp={"enabled": False})
    assert c.checkpoint.tag_validation == "Fail" and c.communication_data_type == "bf16"
    notes = "\n".join(c.ignored_settings())
    for key in ("comms_logger", "activation_checkpointing", "dump_state",
                "communication_data_type", "grad_accum_dtype"):
        assert key in notes
    assert "wandb" not in notes and "csv_monitor" not in notes
    # acted on: dsfast.profiling.flops_profiler, dsfast.engine.monitor
    assert "flops_profiler" not in notes and "tensorboard" not in notes


def test_io_tuning_sections_are_ignored_with_a_note():
    c = cfg(aio={"block_size": 1048576, "queue_depth": 16}, nebula={"enabled": True})
    notes = "\n".join(c.ignored_settings())
    assert '"aio" is ignored: it tunes NVMe offload I/O, and no offload here goes to NVMe' in notes
    assert '"nebula" is ignored' in notes
    _, msg = problems({**BASE, "aio": 3})
    assert "aio: " in msg


def test_aio_is_acted_on_with_nvme_offload_and_the_rest_noted():
    from dsfast.zero.policy.placement import placement_of
    zero = {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "buffer_count": 3}}
    c = cfg(zero_optimization=zero, aio={"block_size": 262144, "thread_count": 4, "queue_depth": 8,
                                         "single_submit": False, "overlap_events": True, "nonsense": 1})
    notes = "\n".join(c.ignored_settings())
    assert "aio.block_size" not in notes and "aio.thread_count" not in notes and '"aio" is ignored' not in notes
    for key in ("queue_depth", "single_submit", "overlap_events", "nonsense"):
        assert f"aio.{key} is ignored" in notes
    target = placement_of(c.zero_optimization, "cpu", aio=c.aio).nvme
    assert (target.path, target.buffer_count, target.threads, target.block_size) == ("/tmp", 3, 4, 262144)
    assert placement_of(c.zero_optimization, "cpu").nvme.threads == 2   # no aio section: the defaults
    both = cfg(zero_optimization=zero, aio={"intra_op_parallelism": 3, "thread_count": 5})
    assert "aio.thread_count is ignored: aio.intra_op_parallelism sets" in "\n".join(both.ignored_settings())
    assert placement_of(both.zero_optimization, "cpu", aio=both.aio).nvme.threads == 3
    one = cfg(zero_optimization=zero, aio={"intra_op_parallelism": 1})
    assert "the NVMe swap uses 2 threads, not 1" in "\n".join(one.ignored_settings())
    assert placement_of(one.zero_optimization, "cpu", aio=one.aio).nvme.threads == 2
    for bad in ({"block_size": 0}, {"thread_count": "4"}, {"queue_depth": True}):
        _, msg = problems({**BASE, "zero_optimization": zero, "aio": bad})
        key = next(iter(bad))
        assert f"aio.{key} must be a positive integer (got {bad[key]!r})" in msg


def test_unsupported_features_error_when_enabled():
    _, msg = problems({**BASE, "pipeline": {"stages": 2}})
    assert "pipeline: pipeline parallelism is not supported" in msg
    _, msg = problems({**BASE, "curriculum_learning": {"enabled": True}})
    assert "curriculum_learning" in msg
    assert cfg(curriculum_learning={"enabled": False}).zero_stage == 0
    _, msg = problems({**BASE, "communication_data_type": "int8"})
    assert "communication_data_type" in msg


def test_ignored_settings_logged_on_load(caplog):
    with caplog.at_level("WARNING", logger="dsfast.config"):
        load_config({**BASE, "comms_logger": {"enabled": True}})
    assert any("comms_logger" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------------------------ sources
def test_config_sources(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_batch_size": 4}))
    assert load_config(str(path)).train_batch_size == 4
    assert load_config(path).source == str(path)
    assert load_config(config_params={"train_batch_size": 6}).train_batch_size == 6
    assert load_config(args=argparse.Namespace(deepspeed_config=str(path), local_rank=0)).train_batch_size == 4
    assert load_config(args=argparse.Namespace(dsfast_config=str(path))).train_batch_size == 4
    # args without a config path are not a source
    assert load_config({"train_batch_size": 2}, args=argparse.Namespace(deepspeed_config=None)).train_batch_size == 2


def test_two_sources_is_an_error(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{}")
    with pytest.raises(DsConfigError, match="config and config_params"):
        load_config({"train_batch_size": 1}, config_params={"train_batch_size": 1})
    with pytest.raises(DsConfigError, match="config and args.deepspeed_config"):
        load_config({"train_batch_size": 1}, args=argparse.Namespace(deepspeed_config=str(path)))
    with pytest.raises(DsConfigError, match="no ds_config given"):
        load_config()
    assert issubclass(DsConfigError, ValueError)


def test_missing_file_names_it(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(DsConfigError, match="not found: .*nope.json"):
        load_config(str(missing))


def test_bad_json_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "train_batch_size": 8,\n  "fp16": {"enabled": true "hysteresis": 2}\n}\n')
    with pytest.raises(DsConfigError) as info:
        load_config(str(path))
    msg = str(info.value)
    assert "bad.json" in msg and "line 3" in msg and "column 28" in msg and "delimiter" in msg


def test_json_comments_and_trailing_commas_accepted_like_deepspeed(tmp_path):
    # DeepSpeed reads files with hjson, so configs in the wild carry comments and trailing commas.
    path = tmp_path / "commented.json"
    path.write_text('{\n  // batch\n  "train_batch_size": 8, # per step\n  /* precision */\n'
                    '  "fp16": {"enabled": true,},\n  "zero_optimization": {"offload_optimizer": {"nvme_path": '
                    '"//not/a/comment", "device": "none"}},\n}\n')
    c = load_config(str(path))
    assert c.precision == "fp16" and c.zero_optimization.offload_optimizer.nvme_path == "//not/a/comment"


def test_base64_config_string_like_deepspeed():
    import base64
    text = base64.urlsafe_b64encode(json.dumps({"train_batch_size": 4}).encode()).decode()
    assert load_config(text).train_batch_size == 4


def test_json_duplicate_key_and_non_object(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(DsConfigError, match="appears twice"):
        load_config(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(DsConfigError, match="JSON object"):
        load_config(str(path))


def test_errors_from_file_name_the_file(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 8, "fp16": {"loss_scale_windw": 10}}))
    err, msg = problems(str(path))
    assert "ds.json" in msg and "fp16.loss_scale_windw" in msg and err.source == str(path)


def test_dsconfig_is_reusable():
    c = cfg(fp16={"enabled": True})
    again = load_config(c, world_size=1)
    assert isinstance(again, DsConfig) and again.precision == "fp16"


# ------------------------------------------------------------------------------------------------ hardening
def test_bool_is_not_a_number():
    _, msg = problems({"train_batch_size": True})
    assert "train_batch_size: must be a number, not true" in msg
    _, msg = problems({**BASE, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": True,
                                                                           "cycle_max_lr": 0.1}}})
    assert "scheduler.params.cycle_min_lr: must be a number, not true" in msg


def test_key_at_wrong_level_points_to_its_section():
    _, msg = problems({**BASE, "loss_scale_window": 100})
    assert "'loss_scale_window' is a key of 'fp16'; move it there" in msg
    _, msg = problems({**BASE, "fp16": {"stage": 1}})
    assert "'stage' is a key of 'zero_optimization'" in msg


def test_auto_placeholder_nested():
    _, msg = problems({**BASE, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
    assert "optimizer.params.lr: 'auto' is a placeholder" in msg


def test_raw_config_reresolves_for_another_world_size():
    c = load_config({"train_batch_size": 16})
    assert c.raw == {"train_batch_size": 16}
    c2 = load_config(c, world_size=4)
    assert (c2.train_micro_batch_size_per_gpu, c2.world_size) == (4, 4)


def test_settings_not_honoured_yet_are_reported():
    from dsfast.config.ds_config import NOT_YET_HONOURED
    c = cfg(prescale_gradients=True, gradient_predivide_factor=2.0)
    notes = c.ignored_settings()
    assert len([n for n in notes if "ignored" in n and n.split(" ")[0] in NOT_YET_HONOURED]) == 2
    assert cfg().ignored_settings() == []
    _, msg = problems({**BASE, "gradient_predivide_factor": 0})
    assert "gradient_predivide_factor" in msg


def test_model_dump_round_trips():
    c = cfg(optimizer={"type": "AdamW", "params": {"lr": 3e-4}}, scheduler={"type": "WarmupLR"},
            fp16={"enabled": True})
    dumped = json.loads(c.model_dump_json(by_alias=True))
    again = load_config(dumped)
    assert again.optimizer.torch_kwargs() == c.optimizer.torch_kwargs() and again.precision == "fp16"


def test_remaining_deepspeed_top_level_keys():
    c = cfg(disable_python_gc=True, managed_gradient_accumulation=False, log_level="info",
            use_data_before_expert_parallelism=True, gradient_allreduce_op="mean", sequence_parallel_size=1,
            optimizer={"type": "sgd", "legacy_fusion": True})
    notes = "\n".join(c.ignored_settings())
    for key in ("log_level", "use_data_before_expert_parallelism", "optimizer.legacy_fusion"):
        assert key in notes
    assert "managed_gradient_accumulation" not in notes       # acted on (tests/test_unmanaged_accumulation.py)
    assert "disable_python_gc" not in notes                   # acted on (tests/test_python_gc.py)
    for bad, key in (({"gradient_allreduce_op": "sum"}, "gradient_allreduce_op"),
                     ({"sequence_parallel_size": 2}, "sequence_parallel_size"),
                     ({"expert_parallel": {"enabled": True}}, "expert_parallel"),
                     ({"log_level": "loud"}, "log_level"),
                     ({"zero_optimization": {"zenflow": {"topk_ratio": 0.1}}}, "zero_optimization.zenflow")):
        _, msg = problems({**BASE, **bad})
        assert f"{key}: " in msg


def test_section_given_as_scalar():
    _, msg = problems({**BASE, "fp16": True})
    assert 'fp16: must be a JSON object (a mapping of settings) such as {"enabled": true} (got True)' in msg


def test_key_of_several_sections_lists_them():
    _, msg = problems({**BASE, "enabled": True})
    assert "'enabled' belongs inside a section such as 'fp16', 'bf16'" in msg


def test_check_command(tmp_path, capsys):
    from dsfast.config.__main__ import main
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"train_batch_size": 32, "fp16": {"enabled": True},
                                "comms_logger": {"enabled": True}, "optimizer": {"type": "AdamW"}}))
    assert main([str(good), "--world-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "micro 8 x accumulation 1 x world 4" in out and "dynamic from 2**16" in out and "note: comms_logger" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"train_batch_size": 32, "fp16": {"hysteresys": 2}}))
    assert main([str(bad)]) == 1
    assert "fp16.hysteresys: unknown key; did you mean 'hysteresis'?" in capsys.readouterr().err
    assert main(["--defaults"]) == 0
    out = capsys.readouterr().out
    assert "fp16.hysteresis = 2  [>= 1]" in out and "fp16.loss_scale_window = 1000\n" in out
    assert 'scheduler.params ("type": "WarmupDecayLR") total_num_steps = required' in out


def test_hjson_file_accepted_like_deepspeed(tmp_path):
    # DeepSpeed 0.19.8 reads config files with hjson (tests/unit/runtime/test_ds_config_dict.py writes one with
    # hjson.dump): quoteless keys and strings, no commas
    import hjson
    given = {"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "bf16": {"enabled": True}}
    path = tmp_path / "config.json"
    path.write_text(hjson.dumps(given))
    assert '"train_batch_size"' not in path.read_text()        # really hjson, not JSON
    c = load_config(str(path))
    assert c.raw == given and c.optimizer.type.lower() == "adamw" and c.precision == "bf16"
    path.write_text("{\n  train_batch_size: 8\n  train_batch_size: 16\n}\n")
    with pytest.raises(DsConfigError, match="appears twice"):       # the duplicate-key check holds for hjson too
        load_config(str(path))
