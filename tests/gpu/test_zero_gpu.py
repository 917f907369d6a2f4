"""ZeRO stages 1-2 on one GPU (world of one): the device path (FusedAdam over the shards, 16-bit copies written by
the kernel) and the offload path (pinned host masters, CPU Adam, copies back) train as stage 0 does."""
import pytest
import torch

import dsfast

pytestmark = pytest.mark.gpu


def _train(stage, precision, offload, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 257), torch.nn.GELU(), torch.nn.Linear(257, 32))
    cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 1000, "gradient_clipping": 0.5,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
           "zero_optimization": {"stage": stage}}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    assert engine.device.type == "cuda"
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 64, generator=g).cuda(), torch.randn(8, 32, generator=g).cuda()
        engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
        engine.step()
    return [p.detach().float().cpu() for p in model.parameters()], engine


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage,offload", [(1, False), (2, False), (2, True)])
def test_zero_on_one_gpu_matches_stage0(precision, stage, offload):
    want, _ = _train(0, precision, False)
    got, engine = _train(stage, precision, offload)
    tol = 1e-5 if precision == "fp32" else 2e-2
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    mem = engine.memory_breakdown()
    if offload:
        assert mem["optimizer_states"].get("host", 0) > 0 and not any(k != "host" for k in mem["optimizer_states"])
