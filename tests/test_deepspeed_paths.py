"""The deepspeed.* import paths programs use beside initialize(): deepspeed.ops.adam, deepspeed.utils.logger /
log_dist, deepspeed.runtime.lr_schedules, deepspeed.runtime.utils.see_memory_usage, deepspeed.checkpointing and
deepspeed.utils.zero_to_fp32, each checked for what it does, not only that it imports."""
import os
import socket

import pytest
import torch

import dsfast
from dsfast.zero.params.partitioned_param import record_of


def test_ops_adam_is_dsfast_s_optimizers():
    from dsfast.ops.adam import DeepSpeedCPUAdam, FusedAdam
    from dsfast.optim import CPUAdam
    from dsfast.optim import FusedAdam as OurFused
    assert DeepSpeedCPUAdam is CPUAdam and FusedAdam is OurFused
    p = torch.nn.Parameter(torch.randn(33))
    q = torch.nn.Parameter(p.detach().clone())
    ours, ref = DeepSpeedCPUAdam([p], lr=1e-2, adamw_mode=True, weight_decay=0.1), \
        torch.optim.AdamW([q], lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        g = torch.randn(33)
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_runtime_lr_schedules_are_dsfast_s(monkeypatch):
    from dsfast.runtime.lr_schedules import LRRangeTest, OneCycle, WarmupCosineLR, WarmupDecayLR, WarmupLR
    from dsfast import schedulers
    assert (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest) == (
        schedulers.WarmupLR, schedulers.WarmupDecayLR, schedulers.WarmupCosineLR, schedulers.OneCycle,
        schedulers.LRRangeTest)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = WarmupLR(opt, warmup_min_lr=0.0, warmup_max_lr=0.1, warmup_num_steps=10, warmup_type="linear")
    for _ in range(5):
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05, rel=0.2)


def test_logger_and_log_dist_print_like_deepspeed(capsys):
    from dsfast.utils import log_dist, logger
    logger.info("hello from the program")
    log_dist("on rank 0 only", ranks=[0])
    log_dist("on rank 3 only", ranks=[3])
    log_dist("on every rank", ranks=[-1])
    out = capsys.readouterr().out
    assert "[INFO]" in out and "hello from the program" in out and "test_deepspeed_paths.py" in out
    assert "[Rank 0] on rank 0 only" in out and "on rank 3 only" not in out and "[Rank 0] on every rank" in out


def test_see_memory_usage_prints_only_when_forced(capsys):
    from dsfast.runtime.utils import see_memory_usage
    assert see_memory_usage("after init") is None
    line = see_memory_usage("after init", force=True)
    assert line.startswith("after init") and "host RSS" in line and line in capsys.readouterr().out


def test_checkpointing_recomputes_with_the_same_gradients():
    from dsfast import checkpointing
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.GELU(), torch.nn.Linear(16, 8))
    x = torch.randn(4, 8, requires_grad=True)
    checkpointing.configure(None)
    assert checkpointing.is_configured()
    state = torch.get_rng_state()
    checkpointing.checkpoint(block, x).square().sum().backward()
    got = [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]
    block.zero_grad()
    x.grad = None
    torch.set_rng_state(state)
    block(x).square().sum().backward()
    want = [p.grad for p in block.parameters()] + [x.grad]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_checkpointing_memory_options_warn_naming_them():
    from dsfast import checkpointing
    with pytest.warns(UserWarning, match="partition_activations=True is not acted on"):
        checkpointing.configure(None, partition_activations=True)
    with pytest.warns(UserWarning, match="checkpoint_in_cpu=True is not acted on"):
        checkpointing.configure(None, deepspeed_config={"activation_checkpointing": {"cpu_checkpointing": True}})


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_zero_to_fp32_reads_a_zero_checkpoint(tmp_path, monkeypatch):
    from dsfast.utils.zero_to_fp32 import (convert_zero_checkpoint_to_fp32_state_dict,
                                           get_fp32_state_dict_from_zero_checkpoint,
                                           load_state_dict_from_zero_checkpoint)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    model[2].bias.requires_grad_(False)                                     # a frozen parameter
    engine, *_ = dsfast.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                   config={"train_batch_size": 2, "zero_optimization": {"stage": 2},
                                           "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}},
                                   dist_init_required=False)
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 6)).square().sum())
        engine.step()
    engine.save_checkpoint(str(tmp_path), "t1")
    sd = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))
    for name, p in model.named_parameters():
        torch.testing.assert_close(sd[name], p.detach().float())
    assert "2.bias" not in get_fp32_state_dict_from_zero_checkpoint(str(tmp_path), exclude_frozen_parameters=True)
    convert_zero_checkpoint_to_fp32_state_dict(str(tmp_path), str(tmp_path / "out"), tag="t1")   # an output dir
    fresh = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    fresh.load_state_dict(torch.load(tmp_path / "out" / "pytorch_model.bin"))
    again = load_state_dict_from_zero_checkpoint(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(),
                                                                     torch.nn.Linear(5, 3)), str(tmp_path))
    for a, b, c in zip(model.parameters(), fresh.parameters(), again.parameters()):
        assert torch.equal(a.detach(), b.detach()) and torch.equal(a.detach(), c.detach())


def test_the_paths_resolve_as_deepspeed_attributes_too():
    import importlib
    assert dsfast.checkpointing.checkpoint is not None and dsfast.runtime is not None
    for name in ("ops.adam", "runtime.lr_schedules", "runtime.utils", "utils.zero_to_fp32"):
        assert os.path.isfile(importlib.import_module(f"dsfast.{name}").__file__)


def _engine(stage=0, **extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3, "steps_per_print": 7,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.8, 0.9]}},
           "zero_optimization": {"stage": stage}, **extra}
    engine, *_ = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                                   dist_init_required=False)
    return engine


def test_the_engine_answers_deepspeed_s_secondary_queries(tmp_path):
    e = _engine(2, zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu"}})
    assert e.get_batch_info() == (6, 2, 3) and e.steps_per_print() == 7 and e.wall_clock_breakdown() is False
    assert e.zero_optimization() and e.zero_offload_optimizer().device == "cpu" and e.zero_offload_param() is None
    assert e.dynamic_loss_scale() is True and e.mp_world_size == 1     # DeepSpeed's: fp16.loss_scale == 0
    assert [tuple(b) for b in e.get_mom()] == [(0.8, 0.9)]
    e.save_fp16_model(str(tmp_path), "weights.bin")
    saved = torch.load(tmp_path / "weights.bin")
    assert set(saved) == set(e.module.state_dict())
    loader = e.deepspeed_io(torch.utils.data.TensorDataset(torch.randn(10, 6)))
    assert loader.batch_size == 2 and len(loader) == 5
    with pytest.raises(ValueError, match="data_sampler"):
        e.deepspeed_io(torch.utils.data.TensorDataset(torch.randn(10, 6)), data_sampler=object())
    e.empty_partition_cache()            # a no-op below stage 3


def test_empty_partition_cache_gives_back_what_generation_left_gathered():
    e = _engine(3, zero_optimization={"stage": 3, "param_persistence_threshold": 0})
    records = [record_of(p) for p in e.module.parameters()]
    with dsfast.zero.GatheredParameters(list(e.module.parameters())):
        pass
    for r in records:                    # as a generate() loop can leave them: gathered outside any forward
        r.gathered or r._launch() or r._publish()
    assert all(r.gathered for r in records)
    e.empty_partition_cache()
    assert not any(r.gathered for r in records)
    loss = e(torch.randn(2, 6)).square().sum()    # and training goes on
    e.backward(loss)


def test_runtime_zero_estimates_print_dsfast_s_model_state_formulas(capsys):
    from dsfast.runtime.zero.stage3 import (estimate_zero3_model_states_mem_needs_all_cold,
                                            estimate_zero3_model_states_mem_needs_all_live)
    from dsfast.runtime.zero.stage_1_and_2 import (estimate_zero2_model_states_mem_needs_all_cold,
                                                   estimate_zero2_model_states_mem_needs_all_live)
    from dsfast.zero import model_state_bytes
    rows = estimate_zero2_model_states_mem_needs_all_cold(7e9, num_gpus_per_node=8, num_nodes=2,
                                                          additional_buffer_factor=1.5)
    assert [r["offload_optimizer"] for r in rows] == [False, True]
    want = model_state_bytes(7 * 10 ** 9, 16, 2, True, True)
    assert rows[1]["device"] == want["device"] and rows[1]["host"] == want["host"] * 8 * 1.5
    assert "offload_optimizer=cpu" in capsys.readouterr().out
    shared = torch.nn.Linear(10, 10)
    model = torch.nn.Sequential(torch.nn.Linear(10, 30), torch.nn.Linear(30, 10), shared, shared)
    live = estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=4)
    cold = estimate_zero3_model_states_mem_needs_all_cold(330 + 310 + 110, 330, num_gpus_per_node=4)
    assert live == cold and len(live) == 8     # the shared layer counted once; 4 offload choices x zero_init
    three = {(r["offload_optimizer"], r["offload_param"], r["zero_init"]): r for r in live}
    want = model_state_bytes(750, 4, 3, True, True, True)
    assert three[True, True, True]["device"] == want["device"] + 2 * 330    # + the largest layer whole, 16-bit
    assert three[True, True, False]["host"] == 4 * 750 * 4 * 1.5           # every rank builds the fp32 model
    assert estimate_zero2_model_states_mem_needs_all_live(model) == estimate_zero2_model_states_mem_needs_all_cold(750)
    with pytest.raises(ValueError, match="num_gpus_per_node"):
        estimate_zero2_model_states_mem_needs_all_cold(1000, num_gpus_per_node=0)


def test_runtime_zero_paths_are_the_stage3_api():
    from dsfast.runtime.zero import GatheredParameters, Init, ZeroParamStatus
    from dsfast.runtime.zero import partition_parameters as pp
    assert (GatheredParameters, Init, ZeroParamStatus) == (dsfast.zero.GatheredParameters, dsfast.zero.Init,
                                                          dsfast.zero.ZeroParamStatus)
    assert (pp.GatheredParameters, pp.Init, pp.ZeroParamStatus, pp.register_external_parameter) == (
        GatheredParameters, Init, ZeroParamStatus, dsfast.zero.register_external_parameter)
    assert [s.name for s in ZeroParamStatus] == ["AVAILABLE", "NOT_AVAILABLE", "INFLIGHT"]


def test_the_engine_reads_its_config_under_deepspeed_s_getter_names():
    e = _engine(2, zero_optimization={"stage": 2, "reduce_bucket_size": 12345, "overlap_comm": True,
                                      "offload_optimizer": {"device": "cpu"}},
                scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": 5}}, gradient_predivide_factor=2.0)
    assert (e.zero_reduce_bucket_size(), e.zero_overlap_comm(), e.zero_cpu_offload()) == (12345, True, True)
    assert e.zero_optimization_partition_gradients() and not e.zero_optimization_partition_weights()
    assert e.zero_gather_16bit_weights_on_model_save() is False and e.zero_allgather_bucket_size() == 500_000_000
    assert e.optimizer_name() == "adamw" and e.optimizer_params() == {"lr": 1e-2, "betas": [0.8, 0.9]}
    assert e.scheduler_name() == "WarmupLR" and e.scheduler_params() == {"warmup_num_steps": 5}
    assert e.gradient_predivide_factor() == 2.0 and e.postscale_gradients() is True
    assert e.dynamic_loss_scale_args()["init_scale"] == 2 ** 16 and e.get_data_parallel_rank() == 0
    assert e.get_model_parallel_rank() == 0 and e.get_sequence_parallel_group() is None
    f = _engine(0, fp16={"enabled": True, "initial_scale_power": 8, "loss_scale_window": 50})
    assert f.initial_dynamic_scale() == 256
    assert f.dynamic_loss_scale_args() == {"init_scale": 256, "scale_window": 50, "delayed_shift": 2,
                                           "consecutive_hysteresis": False, "min_scale": 1.0}


def _step(e, n=1):
    for _ in range(n):
        loss = e(torch.randn(2, 6)).square().sum()
        e.backward(loss)
        e.step()


def test_set_train_batch_size_changes_the_accumulation_at_a_boundary_only():
    e = _engine(1)
    _step(e, 3)                            # one whole cycle of 3
    e.set_train_batch_size(4)
    assert e.get_batch_info() == (4, 2, 2) and e.global_steps == 1
    _step(e, 1)
    assert e.global_steps == 1             # a cycle is now two micro-batches, counted from the change
    _step(e, 1)
    assert e.global_steps == 2
    e.set_train_micro_batch_size(3)
    assert e.get_batch_info() == (6, 3, 2)
    _step(e, 1)
    with pytest.raises(RuntimeError, match="after 1 of 2 micro-batches"):
        e.set_train_batch_size(6)
    with pytest.raises(ValueError, match=r"positive multiple of train_micro_batch_size_per_gpu \* data-parallel "
                                         r"world size = 3 \* 1 = 3"):
        e.set_train_batch_size(4)
    with pytest.raises(ValueError, match="must be a positive int"):
        e.set_train_micro_batch_size(0)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_load_module_state_dict_reaches_the_masters(stage):
    # the loaded weights must survive the next step: at ZeRO stages the optimizer steps its own fp32 masters
    src = _engine(stage, zero_optimization={"stage": stage, "param_persistence_threshold": 0})
    _step(src, 3)
    with dsfast.zero.GatheredParameters(list(src.module.parameters())):
        want = {k: v.detach().clone() for k, v in src.module.state_dict().items()}
    e = _engine(stage, zero_optimization={"stage": stage, "param_persistence_threshold": 0},
                optimizer={"type": "SGD", "params": {"lr": 0.0}})        # a step that moves nothing
    e.load_module_state_dict({"module": want})
    _step(e, 3)
    with dsfast.zero.GatheredParameters(list(e.module.parameters())):
        got = e.module.state_dict()
        for k, v in want.items():
            torch.testing.assert_close(got[k], v, rtol=0, atol=0)
    sd = src.module_state_dict() if stage < 3 else None
    if sd is not None:
        assert set(sd) == set(want)


def test_zero3_consolidated_16bit_state_dict_is_the_whole_weights():
    e = _engine(3, zero_optimization={"stage": 3, "param_persistence_threshold": 0})
    _step(e, 3)
    sd = e._zero3_consolidated_16bit_state_dict()
    with dsfast.zero.GatheredParameters(list(e.module.parameters())):
        for k, v in e.module.state_dict().items():
            assert torch.equal(sd[k], v), k
    assert e.module[0].weight.numel() == 0           # released again


def test_on_device_builds_modules_on_the_device_in_the_dtype_and_restores_both():
    from dsfast.utils import OnDevice
    assert dsfast.OnDevice is OnDevice
    with OnDevice(dtype=torch.float16, device="meta"):
        m = torch.nn.Linear(4, 3)
        idx = torch.arange(3)
    assert (m.weight.dtype, m.weight.device.type, idx.dtype) == (torch.float16, "meta", torch.int64)
    assert torch.get_default_dtype() == torch.float32 and torch.empty(1).device.type == "cpu"
    with pytest.raises(RuntimeError, match="inside"):
        with OnDevice(dtype=torch.bfloat16, device="meta"):
            raise RuntimeError("inside")
    assert torch.get_default_dtype() == torch.float32 and torch.empty(1).device.type == "cpu"
    with OnDevice(dtype=torch.float16, device="meta", enabled=False):
        assert torch.nn.Linear(2, 2).weight.dtype == torch.float32
    with pytest.raises(ValueError, match="a floating-point torch dtype"):
        OnDevice(dtype=torch.int8)


def test_deepspeed_s_top_level_names_and_what_is_not_supported():
    from dsfast.utils import log_dist, logger
    assert (dsfast.log_dist, dsfast.logger, dsfast.TORCH_DISTRIBUTED_DEFAULT_PORT) == (log_dist, logger, 29500)
    assert dsfast.default_inference_config()["dtype"] == torch.float16
    assert not hasattr(dsfast, "PipelineEngine")
    with pytest.raises(AttributeError, match=r"deepspeed.PipelineEngine \(pipeline parallelism\) is not supported"):
        dsfast.PipelineEngine
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        dsfast.no_such_thing
    assert not hasattr(dsfast.zero, "MiCS_Init") and not hasattr(dsfast.zero, "TiledLinear")
    with pytest.raises(AttributeError, match=r"deepspeed.zero.MiCS_Init \(MiCS, .*use deepspeed.zero.Init\) is not "
                                             "supported by dsfast"):
        dsfast.zero.MiCS_Init
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        dsfast.zero.no_such_thing


def test_what_hugging_face_reads_off_deepspeed():
    # accelerate / transformers: deepspeed.runtime.lr_schedules.VALID_LR_SCHEDULES after a plain import,
    # engine.config as the dict given, steps_per_print=inf, clone_tensors_for_torch_save, the zero.Init hook names
    import dsfast.runtime as runtime
    from dsfast.checkpoint.utils import clone_tensors_for_torch_save
    from dsfast.runtime.zero import partition_parameters as pp
    assert "WarmupDecayLR" in runtime.lr_schedules.VALID_LR_SCHEDULES
    assert runtime.engine.DeepSpeedEngine is dsfast.DeepSpeedEngine
    e = _engine(1, steps_per_print=float("inf"))
    assert e.config.get("zero_optimization", {}).get("stage") == 1 and e.config["steps_per_print"] == float("inf")
    assert "optimizer" in e.config and "fp16" not in e.config and e.config.get("fp16") is None
    assert e.config.steps_per_print is None and e.config.zero_stage == 1     # never print; typed fields intact
    with pytest.raises(KeyError, match="'bf16' is not in the config as given"):
        e.config["bf16"]
    base = torch.arange(6.0)
    sd = {"a": base[:2], "b": [base[2:4], (base[4:],)], "n": 3}
    out = clone_tensors_for_torch_save(sd)
    assert out["n"] == 3 and torch.equal(out["b"][1][0], base[4:])
    assert out["a"].untyped_storage().nbytes() == 8 and out["a"].data_ptr() != base.data_ptr()
    assert pp.zero_wrapper_for_fp_tensor_constructor(torch.zeros, torch.float16) is torch.zeros
    assert pp._orig_torch_arange is torch.arange
