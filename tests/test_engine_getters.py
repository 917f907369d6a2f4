"""The engine's DeepSpeed getters return what DeepSpeed 0.19.8's DeepSpeedEngine returns (its runtime/engine.py,
read): the offload sections as config objects, dtypes where DeepSpeed gives dtypes, and `isinstance(engine.optimizer,
...)` true for the wrapper class DeepSpeed would have put around the optimizer at that stage and precision."""
import pytest
import torch

import dsfast
from dsfast.runtime.base_optimizer import DeepSpeedOptimizer, ZeROOptimizer
from dsfast.runtime.bf16_optimizer import BF16_Optimizer
from dsfast.runtime.fp16.fused_optimizer import FP16_Optimizer
from dsfast.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
from dsfast.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from dsfast.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer


def _engine(stage=0, client=None, **extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
           "zero_optimization": {"stage": stage}, **extra}
    optimizer = None
    if client is None:
        cfg.setdefault("optimizer", {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.8, 0.9]}})
    else:
        optimizer = client(model.parameters())
    return dsfast.initialize(model=model, model_parameters=model.parameters(), optimizer=optimizer, config=cfg,
                             dist_init_required=False)[0]


# ------------------------------------------------------------------------------------------------ isinstance
# (stage, precision extras) -> (DeepSpeedOptimizer, ZeROOptimizer, DeepSpeedZeroOptimizer, ..._Stage3,
# BF16_Optimizer, FP16_Optimizer, FP16_UnfusedOptimizer), as DeepSpeed 0.19.8's _configure_optimizer wraps: fp32
# stage 0 none; 16-bit stage 0 FP16_Optimizer over its FusedAdam (the config's Adam / AdamW), FP16_UnfusedOptimizer
# over anything else; stage 1 bf16 with fp32 gradient accumulation BF16_Optimizer; stages 1-2
# DeepSpeedZeroOptimizer; stage 3 ..._Stage3
@pytest.mark.parametrize("stage, extra, want", [
    (0, {}, (False, False, False, False, False, False, False)),
    (0, {"bf16": {"enabled": True}}, (True, False, False, False, False, True, False)),
    (0, {"bf16": {"enabled": True}, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}},
     (True, False, False, False, False, False, True)),
    (0, {"bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "torch_adam": True}}},
     (True, False, False, False, False, False, True)),
    (1, {}, (True, True, True, False, False, False, False)),
    (2, {"bf16": {"enabled": True}}, (True, True, True, False, False, False, False)),
    (1, {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
     (True, True, False, False, True, False, False)),
    (3, {}, (True, True, False, True, False, False, False)),
])
def test_engine_optimizer_is_an_instance_of_deepspeed_s_wrapper_at_its_stage(stage, extra, want):
    e = _engine(stage, **extra)
    classes = (DeepSpeedOptimizer, ZeROOptimizer, DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3,
               BF16_Optimizer, FP16_Optimizer, FP16_UnfusedOptimizer)
    assert tuple(isinstance(e.optimizer, c) for c in classes) == want
    assert not isinstance(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))]), DeepSpeedOptimizer)


def test_a_client_optimizer_at_stage_0_is_wrapped_unfused_whatever_the_config_names():
    """DeepSpeed puts FP16_Optimizer only around its FusedAdam; a program's own optimizer (here with the config's
    Adam section beside it, which initialize() then ignores) gets FP16_UnfusedOptimizer."""
    model = torch.nn.Linear(6, 3)
    cfg = {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": True},
           "optimizer": {"type": "Adam", "params": {"lr": 0.1}}}
    with pytest.warns(UserWarning, match="client optimizer"):
        e = dsfast.initialize(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.1), config=cfg,
                              dist_init_required=False)[0]
    assert isinstance(e.optimizer, FP16_UnfusedOptimizer) and not isinstance(e.optimizer, FP16_Optimizer)
    for cls in (BF16_Optimizer, FP16_Optimizer, FP16_UnfusedOptimizer):
        with pytest.raises(TypeError, match=f"{cls.__name__} is built by deepspeed.initialize"):
            cls(e.optimizer)


def test_client_optimizer_is_the_one_marked_and_the_wrappers_are_not_built_by_hand():
    e = _engine(2, client=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.7))
    assert isinstance(e.optimizer, DeepSpeedZeroOptimizer) and type(e.optimizer) is torch.optim.SGD
    assert issubclass(DeepSpeedZeroOptimizer, ZeROOptimizer) and issubclass(ZeROOptimizer, DeepSpeedOptimizer)
    with pytest.raises(TypeError, match="DeepSpeedZeroOptimizer is built by deepspeed.initialize"):
        DeepSpeedZeroOptimizer(e.optimizer)

    class Mine(DeepSpeedOptimizer):          # programs subclass the base, as DeepSpeed allows
        pass
    assert isinstance(Mine(), DeepSpeedOptimizer) and not isinstance(Mine(), ZeROOptimizer)


# ------------------------------------------------------------------------------------------------ getters
def test_offload_getters_return_the_sections_with_deepspeed_s_defaults():
    e = _engine(2, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})
    off = e.zero_offload_optimizer()
    assert (off.device, off.pin_memory, off.buffer_count, off.pipeline_read, off.ratio) == ("cpu", True, 4, False, 1.0)
    assert e.zero_offload_param() is None and e.zero_cpu_offload() and e.zero_use_cpu_optimizer()
    assert not e.zero_nvme_offload_optimizer() and e.zero_partial_offload() == 1.0 and e.cpuadam_cores_perc() == 0.8
    e3 = _engine(3, zero_optimization={"stage": 3, "offload_param": {"device": "cpu", "pin_memory": False}})
    p = e3.zero_offload_param()
    assert (p.device, p.pin_memory, p.buffer_count, p.buffer_size) == ("cpu", False, 5, 10 ** 8)
    assert e3.zero_offload_optimizer() is None and not e3.zero_use_cpu_optimizer() and e3.super_offload() is False
    assert e3.is_first_weights_partition_group() and not e.is_first_weights_partition_group()
    plain = _engine(0)
    assert plain.zero_offload_optimizer() is None and plain.zero_cpu_offload() is False
    assert plain.zero_partial_offload() == 1.0 and plain.cpuadam_cores_perc() == 0.9     # DeepSpeed's getattr default


def test_precision_getters_answer_as_deepspeed_s():
    e = _engine(0)
    assert e.communication_data_type is torch.float32 and e.dynamic_loss_scale() is True      # fp16.loss_scale 0
    assert e.dynamic_loss_scale_args() == {"init_scale": 2 ** 16, "scale_window": 1000, "delayed_shift": 2,
                                           "consecutive_hysteresis": False, "min_scale": 1.0}
    assert e.torch_autocast_enabled() is False and e.torch_autocast_dtype() is None
    assert e.torch_autocast_lower_precision_safe_modules() == [      # recorded from DeepSpeed 0.19.8's default
        "torch.nn.modules.linear.Linear", "torch.nn.modules.conv.Conv1d", "torch.nn.modules.conv.Conv2d",
        "torch.nn.modules.conv.Conv3d"]
    assert e.optimizer_legacy_fusion() is False
    b = _engine(2, bf16={"enabled": True}, communication_data_type="fp32")
    assert b.communication_data_type is torch.float32 and _engine(0, bf16={"enabled": True}).communication_data_type \
        is torch.bfloat16
    s = _engine(0, fp16={"enabled": True, "loss_scale": 128})
    assert s.dynamic_loss_scale() is False and s.communication_data_type is torch.float16
    assert (b.bf16_master_weights_and_gradients(), b.bf16_optimizer_states(),
            s.fp16_master_weights_and_gradients()) == (False, False, False)


def test_optimizer_name_and_get_mom_follow_the_client_optimizer():
    e = _engine(1)
    assert e.optimizer_name() == "adamw" and e.get_mom() == [(0.8, 0.9)] and e.get_type() == [0.0]
    c = _engine(1, client=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.7))
    assert c.optimizer_name() == "SGD" and c.get_mom() == [0.7] and c.get_lr() == [0.1]
    a = _engine(1, client=lambda ps: torch.optim.Adam(ps, lr=0.1))
    assert a.optimizer_name() == "Adam" and a.get_mom() == [(0.9, 0.999)]


def test_config_getters_deepspeed_added_since():
    e = _engine(2, checkpoint={"tag_validation": "Ignore", "load_universal": True},
                flops_profiler={"enabled": False, "profile_step": 3, "top_modules": 2},
                zero_optimization={"stage": 2, "use_multi_rank_bucket_allreduce": False})
    assert (e.checkpoint_tag_validation_enabled(), e.checkpoint_tag_validation_fail()) == (False, False)
    assert e.load_universal_checkpoint() is True and e.use_node_local_storage() is False
    assert e.checkpoint_serialization_enabled() is True and e.checkpoint_writer_enabled() is False
    assert (e.flops_profiler_enabled(), e.flops_profiler_profile_step(), e.flops_profiler_top_modules(),
            e.flops_profiler_module_depth(), e.flops_profiler_detailed()) == (False, 3, 2, -1, True)
    assert e.zero_multi_rank_bucket_allreduce() is False and e.zero_legacy_stage1() is False
    assert (e.autotuning_enabled(), e.data_efficiency_enabled(), e.curriculum_learning_enabled(),
            e.random_ltd_enabled(), e.is_deepcompile_enabled(), e.autotp_size()) == (False,) * 5 + (0,)
    f = _engine(1, checkpoint={"tag_validation": "fail"})
    assert (f.checkpoint_tag_validation_enabled(), f.checkpoint_tag_validation_fail()) == (True, True)
    assert e.is_map_style_dataset(torch.utils.data.TensorDataset(torch.zeros(2)))
    assert not e.is_iterable_style_dataset([1, 2]) and not e.is_map_style_dataset(iter([]))
