"""The CUDA accelerator on a real GPU: names, memory figures against torch.cuda, RNG, streams/events, pinning.
Skipped without a GPU (tests/conftest.py)."""
import pytest
import torch

from dsfast.accelerator import CudaAccelerator, select_accelerator

pytestmark = pytest.mark.gpu


def test_selected_by_default_and_names():
    acc = select_accelerator({})
    assert isinstance(acc, CudaAccelerator)
    acc.set_device(0)
    assert acc.current_device() == 0 and acc.current_device_name() == "cuda:0"
    assert acc.device_count() == torch.cuda.device_count() and acc.is_available()
    assert acc.on_accelerator(torch.zeros(1, device="cuda")) and not acc.on_accelerator(torch.zeros(1))
    assert acc.is_bf16_supported() == torch.cuda.is_bf16_supported() and torch.float32 in acc.supported_dtypes()


def test_memory_figures_follow_an_allocation():
    acc = CudaAccelerator()
    acc.synchronize()
    acc.reset_peak_memory_stats()
    before = acc.memory_allocated()
    block = torch.empty(4 << 20, dtype=torch.uint8, device="cuda")   # 4 MiB: a multiple of the 512 B granule
    assert acc.memory_allocated() - before == 4 << 20
    assert acc.max_memory_allocated() >= before + (4 << 20)
    del block
    assert acc.memory_allocated() == before and acc.max_memory_allocated() >= before + (4 << 20)
    assert acc.total_memory() == torch.cuda.get_device_properties(0).total_memory > acc.available_memory() > 0


def test_rng_stream_event_pinning():
    acc = CudaAccelerator()
    acc.manual_seed(7)
    a = torch.rand(3, device="cuda")
    acc.manual_seed_all(7)
    assert torch.equal(a, torch.rand(3, device="cuda"))
    state = acc.get_rng_state()
    b = torch.rand(3, device="cuda")
    acc.set_rng_state(state)
    assert torch.equal(b, torch.rand(3, device="cuda"))
    assert acc.default_generator(0) is torch.cuda.default_generators[0]
    s = acc.Stream()
    with acc.stream(s):
        x = torch.ones(8, device="cuda") * 2
    ev = acc.Event()
    ev.record(s)
    ev.synchronize()
    assert x.sum().item() == 16
    pinned = acc.pin_memory(torch.ones(4))
    assert acc.is_pinned(pinned) and acc.pin_memory(torch.ones(4), make_copy=False).is_pinned()
    assert acc.FloatTensor([1.0]).device.type == "cuda"
