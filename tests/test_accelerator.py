"""dsfast.accelerator against DeepSpeed's accelerator semantics: selection (DS_ACCELERATOR), the CPU flavour's
answers (device "cpu", gloo, RSS memory figures) and the CUDA flavour's device-free answers."""
import os

import pytest
import torch

import dsfast
from dsfast.accelerator import (Accelerator, AcceleratorError, CpuAccelerator, CudaAccelerator, get_accelerator,
                                is_current_accelerator_supported, select_accelerator, set_accelerator)
from dsfast.accelerator import select as select_mod
from dsfast.accelerator.cpu import process_rss

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def fresh(monkeypatch):
    """get_accelerator() chooses again (and the choice made here does not leak into other tests)."""
    monkeypatch.setattr(select_mod, "_current", None)
    return monkeypatch


# ------------------------------------------------------------------------------------------------ selection
def test_default_is_cuda_when_usable_else_cpu():
    acc = select_accelerator({})
    assert isinstance(acc, CudaAccelerator if HAS_CUDA else CpuAccelerator)


def test_ds_accelerator_cpu_is_honoured(fresh):
    fresh.setenv("DS_ACCELERATOR", "cpu")
    acc = get_accelerator()
    assert isinstance(acc, CpuAccelerator) and get_accelerator() is acc   # cached


@pytest.mark.skipif(HAS_CUDA, reason="checks the error when no GPU is usable")
def test_ds_accelerator_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(AcceleratorError) as info:
        select_accelerator({"DS_ACCELERATOR": "cuda"})
    msg = str(info.value)
    assert "DS_ACCELERATOR=cuda" in msg and "DS_ACCELERATOR=cpu" in msg


@pytest.mark.parametrize("name, why", [("xpu", "DeepSpeed accelerator dsfast does not support"),
                                       ("gpu", "not an accelerator name"), ("", "not an accelerator name"),
                                       ("CPU", "not an accelerator name")])
def test_unknown_or_unsupported_ds_accelerator_names_the_variable_and_valid_values(fresh, name, why):
    fresh.setenv("DS_ACCELERATOR", name)
    with pytest.raises(AcceleratorError) as info:
        get_accelerator()
    msg = str(info.value)
    assert f"DS_ACCELERATOR={name!r}" in msg and why in msg
    assert "DS_ACCELERATOR=cuda" in msg and "DS_ACCELERATOR=cpu" in msg


def test_set_accelerator_replaces_the_choice_and_rejects_other_objects(fresh):
    mine = CpuAccelerator()
    set_accelerator(mine)
    assert get_accelerator() is mine and is_current_accelerator_supported()
    with pytest.raises(TypeError, match="dsfast.accelerator.Accelerator"):
        set_accelerator(object())
    with pytest.raises(TypeError):
        set_accelerator(None)
    assert get_accelerator() is mine


def test_reachable_the_deepspeed_ways():
    import dsfast.accelerator as mod
    assert dsfast.accelerator is mod
    assert dsfast.get_accelerator is mod.get_accelerator
    assert mod.DeepSpeedAccelerator is Accelerator
    assert mod.CPU_Accelerator is CpuAccelerator and mod.CUDA_Accelerator is CudaAccelerator


# ------------------------------------------------------------------------------------------------ CPU flavour
def test_cpu_device_answers(monkeypatch):
    acc = CpuAccelerator()
    assert acc.device_name() == acc.device_name(3) == acc.current_device_name() == "cpu"
    assert acc._name == "cpu" and acc.device(0) == torch.device("cpu")
    assert acc.communication_backend_name() in ("gloo", "ccl")  # ccl only with oneCCL's torch bindings
    assert acc.is_available() and acc.is_synchronized_device() and acc.use_host_timers()
    assert acc.is_bf16_supported() and isinstance(acc.is_fp16_supported(), bool)
    assert acc.supported_dtypes()[:2] == [torch.float32, torch.bfloat16]
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert acc.current_device() == 2
    monkeypatch.setenv("LOCAL_SIZE", "3")
    assert acc.device_count() == 3
    monkeypatch.delenv("LOCAL_SIZE")
    assert acc.device_count() >= 1
    assert acc.set_device(1) is None and acc.synchronize() is None and acc.empty_cache() is None
    assert acc.on_accelerator(torch.zeros(1)) and not CudaAccelerator().on_accelerator(torch.zeros(1))
    assert acc.amp() is torch.cpu.amp


def test_cpu_rng_is_torch_global_rng():
    acc = CpuAccelerator()
    acc.manual_seed(123)
    a = torch.rand(4)
    acc.manual_seed_all(123)
    assert torch.equal(a, torch.rand(4))
    state = acc.get_rng_state()
    b = torch.rand(4)
    acc.set_rng_state(state)
    assert torch.equal(b, torch.rand(4))
    assert acc.default_generator(0) is torch.default_generator and acc.random() is torch.random
    assert acc.initial_seed() == torch.initial_seed()


def test_cpu_streams_and_events_are_absent_but_usable():
    acc = CpuAccelerator()
    assert acc.Stream is None and acc.Event is None and acc.current_stream() is None
    with acc.stream(None):   # DeepSpeed code wraps work in get_accelerator().stream(s) unconditionally
        x = torch.ones(2) + 1
    assert x.sum() == 4
    with acc.capture_to_graph(acc.create_graph()):
        pass


def _statm_rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_cpu_memory_figures_are_process_rss_with_a_peak():
    acc = CpuAccelerator()
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    assert abs(before - _statm_rss()) < 16 << 20
    big = torch.ones(64 << 20, dtype=torch.uint8)   # 64 MiB, touched
    during = acc.memory_allocated()
    assert during - before > 48 << 20, (before, during)
    peak = acc.max_memory_allocated()
    assert peak >= during
    del big
    assert acc.max_memory_allocated() >= peak        # the peak survives the free
    acc.reset_max_memory_allocated()
    assert acc.max_memory_allocated() < peak or acc.memory_allocated() >= peak - (8 << 20)
    stats = acc.memory_stats()
    assert stats["allocated_bytes.all.peak"] >= stats["allocated_bytes.all.current"] > 0
    assert acc.memory_reserved() > 0 and acc.max_memory_reserved() >= acc.memory_reserved() - (8 << 20)
    assert acc.total_memory() > acc.available_memory() > 0


def test_process_rss_matches_proc():
    if os.path.exists("/proc/self/statm"):
        assert abs(process_rss() - _statm_rss()) < 16 << 20


def test_cpu_pinning_is_a_no_op_copy_semantics_kept():
    acc = CpuAccelerator()
    t = torch.arange(6.0).view(2, 3)
    assert acc.pin_memory(t) is t and not acc.is_pinned(t)
    fresh = acc.pin_memory(t, make_copy=False)
    assert fresh.shape == (2, 3) and fresh.dtype == t.dtype and fresh.data_ptr() != t.data_ptr()
    assert acc.pin_memory(t, make_copy=False, match_shape=False).shape == (6,)
    assert acc.pin_empty(4, 5, dtype=torch.float16).shape == (4, 5)
    assert acc.pin_empty_like(t, dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="device must be cpu"):
        acc.pin_empty(3, dtype=torch.float32, device="meta")


def test_cpu_tensor_types_are_the_legacy_cpu_classes():
    acc = CpuAccelerator()
    assert acc.FloatTensor is torch.FloatTensor and acc.LongTensor is torch.LongTensor
    assert acc.HalfTensor([1.0]).dtype == torch.float16


def test_op_builders_are_deepspeed_s_names_over_dsfast_ops():
    from dsfast.ops.op_builder import CPUAdamBuilder
    acc = CpuAccelerator()
    assert acc.get_op_builder("CPUAdamBuilder") is CPUAdamBuilder and acc.op_builder_dir() == "dsfast.ops.op_builder"
    assert isinstance(acc.create_op_builder("CPUAdamBuilder"), CPUAdamBuilder)
    with pytest.raises(ValueError, match="no DeepSpeed op builder named 'CPUAdamBuilderX'; the builders are: "):
        acc.create_op_builder("CPUAdamBuilderX")


# ------------------------------------------------------------------------------------------------ CUDA flavour
def test_cuda_names_without_touching_a_device():
    acc = CudaAccelerator()
    assert acc.device_name() == "cuda" and acc.device_name(1) == "cuda:1"
    assert acc.communication_backend_name() == "nccl" and acc._name == "cuda"
    assert acc.device(2) == torch.device("cuda", 2)
    assert not acc.is_synchronized_device() and not acc.use_host_timers()
    assert acc.is_available() == HAS_CUDA
    assert acc.export_envs() == ["NCCL"]


# ------------------------------------------------------------------------------------------------ vs DeepSpeed
def test_every_deepspeed_accelerator_method_exists():
    """Optional (runs where deepspeed imports, e.g. /work/venv-ds with DS_ACCELERATOR=cpu)."""
    abstract = pytest.importorskip("deepspeed.accelerator.abstract_accelerator")
    theirs = {n for n in dir(abstract.DeepSpeedAccelerator) if not n.startswith("_")}
    # prefer_triton_grouped_mm: a DeepSpeed MoE kernel choice; dsfast has no MoE kernels
    missing = sorted(n for n in theirs - {"prefer_triton_grouped_mm"}
                     if not hasattr(CpuAccelerator, n) or not hasattr(CudaAccelerator, n))
    assert not missing, missing
