"""The DeepSpeed 0.19.8 import paths frameworks built on it import (accelerate, Lightning, trl, OpenRLHF, ms-swift,
LlamaFactory, verl, ...), each checked for what it does: runtime.utils, git_version_info, the checkpoint engine,
utils.groups, runtime.zero.config / utils / partition_parameters, runtime.fp16.loss_scaler, runtime.config,
ops.op_builder, zero_to_fp32's listings and converters, and the features dsfast refuses when used (pipe, Ulysses
sequence parallelism, AutoTP's gather, universal checkpoints, elasticity). Expected values marked "recorded" were
produced by DeepSpeed 0.19.8's own functions on this machine."""
import inspect
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

import dsfast

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DS_CKPT = os.path.join(REPO, "tests", "data", "deepspeed_ckpt")


def _engine(stage=0, **extra):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": {"stage": stage, "param_persistence_threshold": 0}, **extra}
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


# ------------------------------------------------------------------------------------------------ every path
def test_every_path_imports_through_the_deepspeed_name():
    r = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys, dsfast
        sys.modules["deepspeed"] = dsfast
        import deepspeed
        from deepspeed.runtime.utils import move_to_device, partition_balanced, partition_uniform
        from deepspeed.runtime.base_optimizer import DeepSpeedOptimizer, ZeROOptimizer
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
        from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
        from deepspeed.git_version_info import version, git_hash, git_branch, installed_ops, torch_info
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
        from deepspeed.utils import groups
        from deepspeed.runtime.zero.config import (DeepSpeedZeroConfig, DeepSpeedZeroOffloadOptimizerConfig,
                                                   DeepSpeedZeroOffloadParamConfig, ZeroStageEnum)
        from deepspeed.runtime.zero.offload_config import (OffloadDeviceEnum, DeepSpeedZeroOffloadOptimizerConfig,
                                                           DeepSpeedZeroOffloadParamConfig)
        assert DeepSpeedZeroOffloadParamConfig is deepspeed.runtime.zero.config.DeepSpeedZeroOffloadParamConfig
        from deepspeed.runtime.zero.utils import ZeRORuntimeException, is_zero_param
        from deepspeed.runtime.fp16.loss_scaler import LossScaler, DynamicLossScaler, CreateLossScaler
        from deepspeed.runtime.config import get_gradient_clipping
        from deepspeed.ops.op_builder import CPUAdamBuilder, FusedAdamBuilder, AsyncIOBuilder
        from deepspeed.utils.zero_to_fp32 import get_optim_files, convert_zero_checkpoint_to_state_dict
        from deepspeed.runtime.zero.partition_parameters import (register_external_parameter, ZeroParamType,
            unregister_external_parameter, GatheredParameters, Init, is_zero_param)
        from deepspeed.pipe import PipelineModule, LayerSpec, TiedLayerSpec
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
        from deepspeed.module_inject.layers import GatherReplacedLayerParams
        from deepspeed.checkpoint.ds_to_universal import main
        from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
        from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
        from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
        from deepspeed.utils.tensor_fragment import fragment_address, safe_get_local_fp32_param
        from deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint, detach_variable
        from deepspeed.runtime.activation_checkpointing import checkpointing as ds_checkpointing
        assert ds_checkpointing is deepspeed.checkpointing and deepspeed.runtime.bf16_optimizer.BF16_Optimizer
        assert safe_get_local_fp32_param is deepspeed.utils.safe_get_local_fp32_param
        from deepspeed.utils.timer import SynchronizedWallClockTimer, NoopTimer, ThroughputTimer
        from deepspeed.runtime.engine import (DeepSpeedEngine, DeepSpeedOptimizerCallable, DeepSpeedSchedulerCallable,
                                              MEMORY_OPT_ALLREDUCE_SIZE)
        from deepspeed.runtime.utils import empty_cache
        from deepspeed.utils.nvtx import instrument_w_nvtx
        from deepspeed.runtime.config_utils import DeepSpeedConfigModel, get_scalar_param, pp_int
        from deepspeed.launcher.runner import parse_args as launcher_parse_args
        from deepspeed.utils.logging import warning_once
        assert deepspeed.utils.instrument_w_nvtx is instrument_w_nvtx and deepspeed.utils.logger.warning_once
        from deepspeed.checkpoint.constants import OPTIMIZER_STATE_DICT, FP32_FLAT_GROUPS, FROZEN_PARAM_FRAGMENTS
        assert deepspeed.DeepSpeedOptimizerCallable is DeepSpeedOptimizerCallable and empty_cache() is None
        assert deepspeed.is_compile_supported() in (True, False)
        assert deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3 is DeepSpeedZeroOptimizer_Stage3
        assert deepspeed.DeepSpeedOptimizer is DeepSpeedOptimizer and deepspeed.PipelineModule is PipelineModule
        assert hasattr(deepspeed, "pipe") and deepspeed.zero.ZeroParamType is ZeroParamType
        assert deepspeed.git_version_info.version == version and deepspeed.runtime.fp16.loss_scaler.LossScaler
        try:
            from deepspeed.elasticity import compute_elastic_config
        except ModuleNotFoundError as e:
            print(e)
    """)], capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": REPO})
    assert r.returncode == 0, r.stderr
    assert "No module named 'deepspeed.elasticity'" in r.stdout and "DeepSpeed 0.19.8 removed it too" in r.stdout


def test_the_safe_globals_programs_register_for_torch_load_are_importable_and_load(tmp_path):
    """torch >= 2.6 loads with weights_only=True; programs written for DeepSpeed allow its checkpoint classes first
    (Hugging Face Trainer scripts, Lightning conversions), and that line must work against dsfast too."""
    from dsfast.runtime.fp16.loss_scaler import LossScaler
    from dsfast.runtime.zero.config import ZeroStageEnum
    from dsfast.utils.tensor_fragment import fragment_address
    torch.serialization.add_safe_globals([LossScaler, ZeroStageEnum, fragment_address])
    saved = {"mapping": {"w": fragment_address(numel=6, start=12)}, "stage": ZeroStageEnum.gradients}
    torch.save(saved, tmp_path / "s.pt")
    back = torch.load(tmp_path / "s.pt", weights_only=True)
    assert back == saved and back["mapping"]["w"].numel == 6 and back["mapping"]["w"].start == 12


def test_checkpoint_constants_name_what_deepspeed_wrote():
    """deepspeed.checkpoint.constants against the files DeepSpeed 0.19.8 wrote (tests/data/deepspeed_ckpt)."""
    from dsfast.checkpoint import constants as c
    from dsfast.checkpoint.ds_unpickle import ds_load
    step = os.path.join(DS_CKPT, "stage1_fp32", "global_step2")
    optim_file = c.ZERO_FILE_PREFIX + "0_" + c.MODEL_FILE_PREFIX + "00" + c.OPTIM_FILE_SUFFIX
    model_file = c.MODEL_FILE_PREFIX + "00" + c.MODEL_FILE_SUFFIX
    optim = ds_load(os.path.join(step, optim_file))
    inner = optim[c.OPTIMIZER_STATE_DICT]
    assert {c.BASE_OPTIMIZER_STATE, c.SINGLE_PARTITION_OF_FP32_GROUPS, c.ZERO_STAGE, c.GROUP_PADDINGS,
            c.PARTITION_COUNT, c.CLIP_GRAD, c.DS_VERSION, c.PARAM_SLICE_MAPPINGS} <= set(inner) and c.DS_VERSION in optim
    model = ds_load(os.path.join(step, model_file))
    assert {c.PARAM_SHAPES, c.BUFFER_NAMES, c.FROZEN_PARAM_SHAPES, c.FROZEN_PARAM_FRAGMENTS} <= set(model)
    step3 = os.path.join(DS_CKPT, "stage3_bf16", "global_step2")
    inner3 = ds_load(os.path.join(step3, c.BF16_ZERO_FILE_PREFIX + "0_" + c.MODEL_FILE_PREFIX + "00"
                                  + c.OPTIM_FILE_SUFFIX))[c.OPTIMIZER_STATE_DICT]
    assert {c.FP32_FLAT_GROUPS, c.ZERO_STAGE, c.PARTITION_COUNT} <= set(inner3)


def test_detach_variable_cuts_the_graph_and_keeps_requires_grad():
    from dsfast.checkpointing import detach_variable
    a = torch.ones(3, requires_grad=True) * 2          # not a leaf
    b = torch.zeros(2)
    out = detach_variable((a, b, "tag", None), device="cpu")
    assert out[0].is_leaf and out[0].requires_grad and out[0].grad_fn is None and torch.equal(out[0], a)
    assert not out[1].requires_grad and out[2:] == ("tag", None)
    out[0].sum().backward()                              # a leaf of its own: the original graph is untouched
    assert torch.equal(out[0].grad, torch.ones(3)) and a.grad_fn is not None
    with pytest.raises(TypeError, match="takes a tuple of inputs.*not list"):
        detach_variable([a])


# ------------------------------------------------------------------------------------------------ runtime.utils
def test_move_to_device_walks_containers_and_moves_in_place_where_asked():
    from dsfast.runtime.utils import move_to_device
    a, b, c = torch.ones(2), torch.zeros(3), torch.arange(4)
    out = move_to_device({"x": [a, (b, "label")], "n": c}, "meta")
    assert out["x"][0].device.type == "meta" and out["x"][1][0].device.type == "meta" and out["n"].is_meta
    assert isinstance(out["x"][1], tuple) and out["x"][1][1] == "label" and a.device.type == "cpu"
    # the criterion picks what moves in place (the same object, new storage); the rest is copied as above. On a
    # CPU-only machine a dtype stands in for a second device (Tensor.to takes either)
    p = torch.nn.Parameter(torch.ones(3))
    moved = move_to_device([p, b], torch.float64, criterion_func=lambda t: isinstance(t, torch.nn.Parameter))
    assert moved[0] is p and p.dtype == torch.float64 and isinstance(p, torch.nn.Parameter)
    assert moved[1] is not b and moved[1].dtype == torch.float64 and b.dtype == torch.float32


@pytest.mark.parametrize("weights, parts, recorded", [
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, [0, 5, 7, 9]), ([5, 1, 1, 1, 1, 5], 2, [0, 3, 6]),
    ([3, 3, 3, 3], 4, [0, 1, 2, 3, 4]), ([1, 1], 4, [0, 1, 2, 2, 2]),
    ([2, 7, 1, 8, 2, 8, 1, 8, 2, 8], 4, [0, 3, 5, 8, 10]), ([4, 4, 4, 4, 4, 4], 3, [0, 2, 4, 6]),
    ([0, 0, 0, 5], 2, [0, 3, 4]), ([1, 2, 3], 1, [0, 3]), ([10, 1, 1, 1, 1, 1, 1, 1, 1, 1], 3, [0, 1, 6, 10]),
    ([1.5, 2.5, 0.5, 3.0], 2, [0, 2, 4])])
def test_partition_balanced_gives_deepspeed_s_boundaries(weights, parts, recorded):
    from dsfast.runtime.utils import partition_balanced
    assert partition_balanced(weights, parts) == recorded


def test_partition_uniform_and_bad_part_counts():
    from dsfast.runtime.utils import partition_balanced, partition_uniform, prefix_sum_inc
    assert [partition_uniform(n, m) for n, m in [(10, 3), (2, 4), (7, 7), (9, 2)]] == \
        [[0, 4, 7, 10], [0, 1, 2, 2, 2], [0, 1, 2, 3, 4, 5, 6, 7], [0, 5, 9]]     # recorded
    assert prefix_sum_inc([3, 4, 5]) == [3, 7, 12]
    with pytest.raises(ValueError, match="num_parts must be a positive int, got 0"):
        partition_balanced([1, 2], 0)


# ------------------------------------------------------------------------------------------------ git_version_info
def test_git_version_info_answers_in_setup_py_s_shape():
    from dsfast import git_version_info as g
    from dsfast.alias_install import VERSION
    assert g.version == VERSION and g.version.startswith("0.19.8+dsfast.")
    assert (g.git_hash, g.git_branch) == ("unknown", "unknown")
    assert set(g.torch_info) == {"version", "bf16_support", "cuda_version", "nccl_version", "hip_version"}
    assert g.torch_info["version"] == ".".join(torch.__version__.split(".")[:2])
    assert g.compatible_ops["cpu_adam"] is True and g.compatible_ops["async_io"] is False
    assert set(g.installed_ops) == set(g.compatible_ops) >= {"cpu_adam", "fused_adam", "cpu_adagrad", "cpu_lion"}


# ------------------------------------------------------------------------------------------------ checkpoint engine
def test_torch_checkpoint_engine_saves_loads_and_commits(tmp_path):
    from dsfast.runtime.checkpoint_engine import CheckpointCommitInfo, CheckpointEngine
    from dsfast.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    state = {"w": torch.randn(3, 2), "step": 7, "nested": {"b": torch.arange(3)}}
    legacy = TorchCheckpointEngine()                       # no config: torch's legacy format, as DeepSpeed's
    info = CheckpointCommitInfo(tag="t1", save_dir=str(tmp_path), save_latest=True)
    legacy.create(info)
    legacy.makedirs(str(tmp_path / "t1"), exist_ok=True)
    legacy.save(state, str(tmp_path / "t1" / "a.pt"))
    assert legacy.commit(info) is True and not zipfile.is_zipfile(tmp_path / "t1" / "a.pt")
    back = legacy.load(str(tmp_path / "t1" / "a.pt"), map_location="cpu")
    assert torch.equal(back["w"], state["w"]) and back["step"] == 7 and torch.equal(back["nested"]["b"], torch.arange(3))
    zipped = TorchCheckpointEngine(_engine().config)       # the config's checkpoint_serialization, default true
    zipped.save(state, str(tmp_path / "b.pt"))
    assert zipfile.is_zipfile(tmp_path / "b.pt") and zipped.name == "TorchCheckpointEngine"
    off = _engine(checkpoint={"checkpoint_serialization": False}).config
    assert TorchCheckpointEngine(off).zipfile_serialization is False    # and the config says dsfast's own ignore it:
    assert any(n.startswith("checkpoint.checkpoint_serialization is ignored: dsfast's checkpoints are safetensors")
               for n in off.ignored_settings())
    assert TorchCheckpointEngine({"checkpoint": {"checkpoint_serialization": False}}).zipfile_serialization is False
    assert zipped.is_data_parallel_writer(0) and not zipped.is_data_parallel_writer(1)
    with pytest.raises(TypeError, match="abstract"):
        CheckpointEngine()


# ------------------------------------------------------------------------------------------------ utils.groups
def test_groups_without_a_process_group_are_one_rank():
    from dsfast.utils import groups
    assert (groups.get_data_parallel_group(), groups.get_data_parallel_world_size(),
            groups.get_data_parallel_rank(), groups._get_data_parallel_rank()) == (None, 1, 0, 0)
    assert (groups.get_model_parallel_world_size(), groups.get_tensor_model_parallel_rank(),
            groups._get_model_parallel_world_size(), groups._get_sequence_parallel_world_size(),
            groups._get_sequence_parallel_rank(), groups._get_sequence_data_parallel_world_size()) == (1, 0, 1, 1, 0, 1)
    assert groups._get_expert_parallel_group_dict() == {} and groups._get_max_expert_size() is None
    with pytest.raises(KeyError, match="No sequence parallel group found"):
        groups._get_sequence_parallel_group()
    with pytest.raises(KeyError, match="'ep_size_2' not found: dsfast has no MoE expert parallelism"):
        groups._get_expert_data_parallel_world_size("ep_size_2")
    with pytest.raises(RuntimeError, match="get_model_parallel_group\\(\\): dsfast has no tensor / model"):
        groups.get_model_parallel_group()


def test_groups_with_a_process_group_are_the_world(tmp_path):
    import torch.distributed as dist
    from dsfast.utils import groups
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert groups._get_data_parallel_group() is dist.group.WORLD
        assert (groups.get_data_parallel_world_size(), groups._get_data_parallel_rank()) == (1, 0)
        assert list(groups._get_data_parallel_group_ranks()) == [0]
        assert groups._get_sequence_data_parallel_group() is dist.group.WORLD
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------ zero config / utils
def test_zero_config_models_are_dsfast_s_validated_ones_with_deepspeed_s_defaults():
    from dsfast.runtime.zero.config import (DeepSpeedZeroConfig, DeepSpeedZeroOffloadOptimizerConfig,
                                            DeepSpeedZeroOffloadParamConfig, OffloadDeviceEnum, ZeroStageEnum,
                                            get_zero_config)
    z = DeepSpeedZeroConfig(stage=3, stage3_param_persistence_threshold=0, offload_param={"device": "cpu"})
    assert z.param_persistence_threshold == 0 and z.offload_param.device == OffloadDeviceEnum.cpu
    assert (z.offload_param.pin_memory, z.offload_param.buffer_count, z.offload_param.max_in_cpu) == (True, 5, 10 ** 9)
    o = DeepSpeedZeroOffloadOptimizerConfig()
    assert (o.device, o.pin_memory, o.buffer_count, o.ratio, o.pipeline) == ("none", True, 4, 1.0, False)
    assert DeepSpeedZeroOffloadOptimizerConfig(device="nvme", nvme_path="/x", pipeline_read=True).pipeline is True
    assert DeepSpeedZeroOffloadParamConfig(device="CPU").device == "cpu"
    assert ZeroStageEnum(3) is ZeroStageEnum.weights and ZeroStageEnum.gradients == 2
    assert get_zero_config({"zero_optimization": True}).stage == 1 and get_zero_config({}).stage == 0
    with pytest.raises(ValueError, match="must be one of 'none', 'cpu', 'nvme'"):
        DeepSpeedZeroOffloadParamConfig(device="gpu")
    with pytest.raises(TypeError, match="as a dict"):
        get_zero_config("ds.json")


def test_is_zero_param_and_the_zero_tested_optimizers():
    from dsfast.ops.adam import DeepSpeedCPUAdam
    from dsfast.runtime.zero.utils import ZeRORuntimeException, is_zero_param, is_zero_supported_optimizer
    e3, e2 = _engine(3), _engine(2)
    assert all(is_zero_param(p) for p in e3.module.parameters())
    assert not any(is_zero_param(p) for p in e2.module.parameters()) and not is_zero_param([1])
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert is_zero_supported_optimizer(torch.optim.AdamW(p)) and is_zero_supported_optimizer(DeepSpeedCPUAdam(p))
    assert not is_zero_supported_optimizer(torch.optim.SGD(p, lr=0.1))
    from dsfast.runtime.zero import utils
    utils.ZERO_SUPPORTED_OPTIMIZERS.append(torch.optim.SGD)         # as programs add theirs (apex's FusedAdam)
    try:
        assert is_zero_supported_optimizer(torch.optim.SGD(p, lr=0.1))
    finally:
        utils.ZERO_SUPPORTED_OPTIMIZERS.remove(torch.optim.SGD)
    assert issubclass(ZeRORuntimeException, Exception)


def test_register_and_unregister_external_parameter():
    from dsfast.runtime.zero import partition_parameters as pp
    e = _engine(3)
    head, tail = e.module[0], e.module[2]
    pp.register_external_parameter(tail, head.weight)
    assert [r.param for r in tail.__dict__["_dsfast_external"]] == [head.weight]
    pp.unregister_external_parameter(tail, head.weight)
    assert tail.__dict__["_dsfast_external"] == []
    plain = torch.nn.Linear(2, 2)
    pp.register_external_parameter(plain, plain.weight)              # not partitioned: remembered only
    pp.unregister_external_parameter(plain, plain.weight)
    with pytest.raises(RuntimeError, match="is not a registered external parameter of this Linear"):
        pp.unregister_external_parameter(plain, plain.weight)
    with pytest.raises(RuntimeError, match="must be a torch.nn.Parameter, got Tensor"):
        pp.register_external_parameter(plain, torch.zeros(2))
    assert [t.name for t in pp.ZeroParamType] == ["NORMAL", "PARTITIONED", "REMOTE"]
    assert pp.ZeroParamType is dsfast.zero.ZeroParamType and pp.is_zero_param(head.weight)


# ------------------------------------------------------------------------------------------------ loss scaler
def test_create_loss_scaler_builds_dsfast_s_scalers_from_the_engine_s_args():
    from dsfast.precision import build_loss_scaler
    from dsfast.runtime.fp16.loss_scaler import CreateLossScaler, DynamicLossScaler, LossScaler
    args = _engine(0, fp16={"enabled": True, "initial_scale_power": 8, "loss_scale_window": 3}
                   ).dynamic_loss_scale_args()
    ds = CreateLossScaler(torch.half, 0, True, args)
    ours = build_loss_scaler({"enabled": True, "initial_scale_power": 8, "loss_scale_window": 3})
    assert isinstance(ds, DynamicLossScaler) and ds.delayed_shift == 2 and ds.dtype == torch.half
    for overflow in [True, True, False, False, False, False, True, False]:
        ds.update_scale(overflow)
        ours.update_scale(overflow)
        assert (ds.cur_scale, ds.cur_hysteresis) == (ours.cur_scale, ours.cur_hysteresis)
    assert ds.cur_scale == 256 and ds.dynamic                 # halved once (hysteresis 2), doubled after 3 clean
    static = CreateLossScaler(torch.half, 128.0, False, None)
    assert isinstance(static, LossScaler) and static.loss_scale == 128 and not static.has_overflow([])
    assert CreateLossScaler(torch.bfloat16, 128.0, False, None).loss_scale == 1.0
    with pytest.raises(ValueError, match="needs dynamic_loss_args"):
        CreateLossScaler(torch.half, 0, True, None)


def test_scaler_backward_and_overflow_probe():
    from dsfast.runtime.fp16.loss_scaler import DynamicLossScaler
    s = DynamicLossScaler(init_scale=64, scale_window=10, min_scale=1, delayed_shift=1, consecutive_hysteresis=False)
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    s.backward((w * w).sum())
    assert torch.equal(w.grad, 64 * 2 * w.detach()) and not s.has_overflow_serial([w])
    w.grad[0] = float("inf")
    assert s.has_overflow_serial([w])
    s.update_scale(True)
    assert s.loss_scale == 32


def test_get_gradient_clipping_reads_the_dict_with_deepspeed_s_default():
    from dsfast.runtime.config import get_gradient_clipping
    assert get_gradient_clipping({}) == 1.0 and get_gradient_clipping({"gradient_clipping": 0.5}) == 0.5
    with pytest.raises(TypeError, match="as a dict"):
        get_gradient_clipping(None)


# ------------------------------------------------------------------------------------------------ op builders
def test_op_builders_load_dsfast_s_ops_and_refuse_the_ones_it_lacks():
    from dsfast.ops import DsfastOpError, load
    from dsfast.ops.op_builder import ALL_OPS, AsyncIOBuilder, CPUAdagradBuilder, CPUAdamBuilder, FusedAdamBuilder
    b = CPUAdamBuilder()
    assert b.load() is load("cpu_optim") and b.is_compatible() and b.NAME == "cpu_adam"
    assert b.absolute_name() == "deepspeed.ops.cpu_adam.cpu_adam_op" and FusedAdamBuilder().dsfast_op == "cuda_optim"
    assert not AsyncIOBuilder().is_compatible()
    # Adagrad and Lion are kernels of the same cpu_optim op as Adam (deepspeed.ops.adagrad / .lion)
    assert CPUAdagradBuilder().load() is load("cpu_optim") and CPUAdagradBuilder().dsfast_op == "cpu_optim"
    with pytest.raises(DsfastOpError, match="'async_io' op is not available in dsfast: dsfast's NVMe offload"):
        AsyncIOBuilder().load()
    assert isinstance(ALL_OPS["cpu_adam"], CPUAdamBuilder)


def test_op_builder_is_incompatible_when_only_the_reference_is_left_and_fallback_is_forbidden(monkeypatch):
    from dsfast.ops import status
    from dsfast.ops.op_builder import FusedAdamBuilder
    monkeypatch.setattr(status, "op_status", lambda spec: (status.UNAVAILABLE, "no nvcc"))
    monkeypatch.setenv("DSFAST_REQUIRE_OPS", "1")
    assert FusedAdamBuilder().is_compatible() is False
    monkeypatch.setenv("DSFAST_REQUIRE_OPS", "0")
    assert FusedAdamBuilder().is_compatible() is True          # the pure-torch reference stands in


# ------------------------------------------------------------------------------------------------ zero_to_fp32
def test_get_optim_files_lists_deepspeed_s_and_dsfast_s_per_rank_files(tmp_path):
    from dsfast.utils.zero_to_fp32 import get_model_state_files, get_optim_files
    tag = os.path.join(DS_CKPT, "stage1_fp32", "global_step2")
    assert [os.path.basename(f) for f in get_optim_files(tag)] == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert len(get_model_state_files(os.path.join(DS_CKPT, "stage3_fp32", "global_step2"))) == 2
    e = _engine(2)
    e.save_checkpoint(str(tmp_path), "t1")
    assert [os.path.basename(f) for f in get_optim_files(str(tmp_path / "t1"))] == ["optim_rank00000.safetensors"]
    many = tmp_path / "many"
    many.mkdir()
    for r in (10, 2, 1):
        (many / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"")
    assert [os.path.basename(f).split("_")[3] for f in get_optim_files(str(many))] == ["1", "2", "10"]
    with pytest.raises(FileNotFoundError, match="give the tag folder"):
        get_optim_files(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="doesn't exist"):
        get_optim_files(str(tmp_path / "nowhere"))


def test_convert_zero_checkpoint_to_state_dict_writes_deepspeed_s_files(tmp_path):
    pytest.importorskip("huggingface_hub")
    from dsfast.checkpoint.safetensors_io import read_file
    from dsfast.utils.zero_to_fp32 import convert_zero_checkpoint_to_state_dict, get_fp32_state_dict_from_zero_checkpoint
    e = _engine(2)
    e.save_checkpoint(str(tmp_path / "ck"), "t1")
    want = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path / "ck"))
    out = tmp_path / "out"
    convert_zero_checkpoint_to_state_dict(str(tmp_path / "ck"), str(out), dtype="bf16", max_shard_size=100,
                                          safe_serialization=True)
    files = sorted(os.listdir(out))
    assert "model.safetensors.index.json" in files and len(files) > 2     # sharded, with its index
    got = {}
    for f in files:
        if f.endswith(".safetensors"):
            got.update(read_file(str(out / f)))
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], v.to(torch.bfloat16))
    with pytest.raises(ValueError, match="Unsupported output dtype 'int8'"):
        convert_zero_checkpoint_to_state_dict(str(tmp_path / "ck"), str(out), dtype="int8")


# ------------------------------------------------------------------------------------------------ refused features
def test_pipe_specs_build_and_a_pipeline_module_is_refused():
    from dsfast.pipe import LayerSpec, PipelineModule, TiedLayerSpec
    from dsfast.unsupported import UnsupportedFeatureError
    spec = LayerSpec(torch.nn.Linear, 4, 3, bias=False)
    layer = spec.build()
    assert isinstance(layer, torch.nn.Linear) and layer.bias is None and repr(spec) == "Linear(4, 3, bias=False)"
    tied = TiedLayerSpec("embed", torch.nn.Embedding, 10, 4, tied_weight_attr="weight")
    assert tied.key == "embed" and tied.tied_weight_attr == ["weight"] and tied.build().weight.shape == (10, 4)
    with pytest.raises(RuntimeError, match="only supports torch.nn.Module types"):
        LayerSpec(int)

    class Stack(PipelineModule):                 # what DeepSpeed's test models do at import time
        pass
    with pytest.raises(UnsupportedFeatureError, match=r"Stack\(num_stages=2\): pipeline parallelism"):
        Stack(layers=[spec], num_stages=2)
    assert issubclass(UnsupportedFeatureError, NotImplementedError)
    from dsfast.moe.utils import MoEUnsupportedError
    assert issubclass(MoEUnsupportedError, UnsupportedFeatureError)


def test_ulysses_sequence_parallelism_is_refused_where_accelerate_calls_it():
    from dsfast.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter
    from dsfast.unsupported import UnsupportedFeatureError
    assert "disable_in_eval" in inspect.signature(UlyssesSPAttentionHF.register_with_transformers).parameters
    with pytest.raises(UnsupportedFeatureError, match=r"sequence_parallel_size=4\): Ulysses sequence parallelism"):
        UlyssesSPAttentionHF.register_with_transformers(model_name_or_path="m", core_attn_implementation="sdpa",
                                                        sequence_parallel_size=4, micro_batch_size=1)
    with pytest.raises(UnsupportedFeatureError, match="sp_world_size=2"):
        UlyssesSPDataLoaderAdapter([], sp_rank=0, sp_group=None, sp_world_size=2, device="cpu")


def test_gather_replaced_layer_params_is_a_no_op_for_layers_not_replaced_and_refuses_replaced_ones():
    from dsfast.module_inject.layers import GatherReplacedLayerParams
    from dsfast.unsupported import UnsupportedFeatureError
    layer = torch.nn.Linear(3, 2)
    before = layer.weight.detach().clone()
    with GatherReplacedLayerParams(layer.parameters(), layer) as got:
        assert got is None and layer.weight.shape == (2, 3)
    assert torch.equal(layer.weight, before)
    layer.weight.ds_is_replaced_module = True
    with pytest.raises(UnsupportedFeatureError, match="AutoTP-replaced layers"):
        GatherReplacedLayerParams([layer.weight], layer)
    GatherReplacedLayerParams([layer.weight], layer, enabled=False)       # disabled: never looks


def test_ds_to_universal_refuses_naming_what_dsfast_does_instead():
    from dsfast.checkpoint.ds_to_universal import main, parse_arguments
    from dsfast.unsupported import UnsupportedFeatureError
    args = parse_arguments(["--input_folder", "ck/global_step2", "--output_folder", "uni"])
    assert (args.input_folder, args.strict, args.num_extract_workers) == ("ck/global_step2", True, 4)
    with pytest.raises(UnsupportedFeatureError, match="'ck/global_step2'.*any world size.*convert-deepspeed"):
        main(args)


# ------------------------------------------------------------------------------------------------ runtime.config_utils
def test_config_model_sections_behave_as_deepspeed_s():
    """deepspeed.runtime.config_utils.DeepSpeedConfigModel, as plugins subclass it: "auto" is the default, unknown
    keys and out-of-range values are errors (on assignment too), a deprecated key is carried to its replacement."""
    import json

    import pydantic
    from pydantic import Field

    from dsfast.runtime.config_utils import DeepSpeedConfigModel, dict_raise_error_on_duplicate_keys, pp_int

    class Section(DeepSpeedConfigModel):
        enabled: bool = False
        size: int = Field(8, ge=1)
        old_size: int = Field(8, json_schema_extra={"deprecated": True, "new_param": "size",
                                                      "new_param_fn": lambda v: 2 * v})

    assert Section(size="auto").size == 8 and Section(size=3).size == 3
    with pytest.warns(DeprecationWarning, match="'old_size' is deprecated; use 'size' instead"):
        s = Section(old_size=5)
    assert s.size == 10 and s.old_size == 5                      # new_param_fn applied
    s.enabled = True                                              # a later assignment does not re-run the carry
    with pytest.raises(pydantic.ValidationError, match="sise"):
        Section(sise=4)
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 1"):
        s.size = 0
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="both 'old_size' .* and 'size'"):
        Section(old_size=4, size=2)
    with pytest.raises(ValueError, match="duplicate key.*'a'"):
        json.loads('{"a": 1, "b": 2, "a": 3}', object_pairs_hook=dict_raise_error_on_duplicate_keys)
    assert json.loads('{"a": 1}', object_pairs_hook=dict_raise_error_on_duplicate_keys) == {"a": 1}
    assert repr(pp_int(1234567)) == "1,234,567" and repr(pp_int(5, "five")) == "five" and pp_int(5) + 1 == 6
