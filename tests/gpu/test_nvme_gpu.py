"""NVMe offload with a GPU: the window's buffers are pinned by registering their pages (no rounding up to a power of
two), and training with the states (or stage 3's parameters) on NVMe is bitwise the CPU offload's."""
import pytest
import torch

import dsfast
from dsfast.zero.nvme.buffers import HostBuffer

pytestmark = pytest.mark.gpu


def test_a_pinned_buffer_is_registered_at_its_exact_size_and_copies_asynchronously():
    b = HostBuffer(3 * 4096 + 1, pin=True)
    assert b.pinned and b.tensor.is_pinned() and b.nbytes == 4 * 4096
    b.tensor.random_(0, 256)
    dev = b.tensor.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), b.tensor)
    b.free()


def _train(zero, steps=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 257), torch.nn.GELU(), torch.nn.Linear(257, 32))
    cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 1000, "gradient_clipping": 0.5,
           "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": zero}
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 64, generator=g).cuda(), torch.randn(8, 32, generator=g).cuda()
        engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
        engine.step()
    with dsfast.zero.GatheredParameters(list(model.parameters())):   # (whole already below stage 3)
        return [p.detach().cpu() for p in model.parameters()], engine


def test_nvme_offload_on_a_gpu_is_bitwise_cpu_offload(tmp_path):
    stage2 = {"stage": 2, "reduce_bucket_size": 5000}
    want, _ = _train({**stage2, "offload_optimizer": {"device": "cpu", "pin_memory": True}})
    got, engine = _train({**stage2, "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path),
                                                          "pin_memory": True, "buffer_count": 3}})
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert all(buf.is_pinned() for buf in engine.state_owner.swap.host_buffers())


def test_stage3_parameters_on_nvme_on_a_gpu_are_bitwise_cpu_offload(tmp_path):
    stage3 = {"stage": 3, "stage3_param_persistence_threshold": 0, "offload_optimizer": {"device": "cpu"}}
    want, _ = _train({**stage3, "offload_param": {"device": "cpu", "pin_memory": True}})
    got, engine = _train({**stage3, "offload_param": {"device": "nvme", "nvme_path": str(tmp_path),
                                                      "pin_memory": True, "buffer_count": 3, "max_in_cpu": 0}})
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert all(buf.is_pinned() for buf in engine.state_owner.param_swap.host_buffers())
