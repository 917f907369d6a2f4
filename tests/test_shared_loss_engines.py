"""Several engines trained by one shared loss (DeepSpeed's test_multiple_models shape): the engines' outputs summed
into one loss and a plain loss.backward() give every engine the gradient of its own term, so each ends exactly
where it would with its own engine.backward(), in bf16 with fp32 gradient accumulation at ZeRO stage 1."""
import pytest
import torch

import dsfast

CFG = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0,
       "optimizer": {"type": "Adam", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": 1},
       "bf16": {"enabled": True, "immediate_grad_update": True}, "data_types": {"grad_accum_dtype": "fp32"}}


def _engines(n):
    out = []
    for _ in range(n):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        out.append(dsfast.initialize(model=m, model_parameters=m.parameters(), config=CFG,
                                     dist_init_required=False)[0])
    return out


def _batch(step):
    return torch.randn(1, 8, generator=torch.Generator().manual_seed(step)).bfloat16()


@pytest.mark.parametrize("n", [2, 3])
def test_one_plain_backward_of_the_summed_loss_trains_each_engine_as_its_own_backward(n):
    shared, own = _engines(n), _engines(n)
    start = [p.detach().clone() for p in shared[0].module.parameters()]
    for step in range(3):
        x = _batch(step)
        sum(e(x).float().pow(2).sum() / (i + 1) for i, e in enumerate(shared)).backward()
        for i, e in enumerate(own):
            e.backward(e(x).float().pow(2).sum() / (i + 1))
        for e in shared + own:
            e.step()
    for a, b in zip(shared, own):
        for p, q in zip(a.module.parameters(), b.module.parameters()):
            assert torch.equal(p, q)
    assert not any(torch.equal(p, q) for p, q in zip(shared[0].module.parameters(), start))   # they trained
