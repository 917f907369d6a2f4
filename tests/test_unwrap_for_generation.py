"""deepspeed.runtime.zero.unwrap_model_for_generation (TRL's and OpenRLHF's generation wrapper): the parameters are
whole for the block and stay whole across its forwards (gathered once), the outputs are the model's, and training
after the block is exactly what it would have been without it."""
import torch

import dsfast
from dsfast.runtime.zero import ZeroParamStatus, unwrap_model_for_generation

CFG = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
       "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1}}


def _engine():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return dsfast.initialize(model=m, model_parameters=m.parameters(), config=CFG, dist_init_required=False)[0]


def _step(engine, seed):
    g = torch.Generator().manual_seed(seed)
    engine.backward(engine(torch.randn(2, 8, generator=g)).pow(2).mean())
    engine.step()


def test_parameters_stay_whole_across_forwards_and_outputs_are_the_model_s():
    engine = _engine()
    _step(engine, 0)
    x = torch.randn(3, 8)
    with unwrap_model_for_generation(engine) as model:
        assert model is engine
        params = list(engine.module.parameters())
        assert all(p.ds_status is ZeroParamStatus.AVAILABLE and p.numel() > 0 for p in params)
        whole = [p.detach().clone() for p in params]
        with torch.no_grad():
            out = engine(x)
            engine(x[:1])
        assert all(p.ds_status is ZeroParamStatus.AVAILABLE for p in params)   # not released by the forwards
    w1, b1, w2, b2 = whole
    torch.testing.assert_close(out, torch.relu(x @ w1.T + b1) @ w2.T + b2, rtol=0, atol=1e-6)
    assert all(p.ds_status is ZeroParamStatus.NOT_AVAILABLE and p.numel() == 0 for p in params)


def test_training_after_the_block_is_unchanged_by_it():
    used, plain = _engine(), _engine()
    for engine, generate in ((used, True), (plain, False)):
        _step(engine, 1)
        if generate:
            with unwrap_model_for_generation(engine), torch.no_grad():
                engine(torch.randn(5, 8))
        _step(engine, 2)
    with dsfast.zero.GatheredParameters(list(used.module.parameters()) + list(plain.module.parameters())):
        for a, b in zip(used.module.parameters(), plain.module.parameters()):
            assert torch.equal(a, b)
