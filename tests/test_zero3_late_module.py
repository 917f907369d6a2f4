"""A submodule attached to a ZeRO stage 3 model after initialize (DeepSpeed#6961's shape: its _parameters a plain
dict, as torch >= 2.5 makes them): the forward runs it as an ordinary module and gives the plain model's output."""
import torch

import dsfast


def test_forward_after_a_late_submodule_attach_matches_the_plain_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16, bias=False))
    cfg = {"train_batch_size": 1, "zero_optimization": {"stage": 3}}
    engine = dsfast.initialize(model=model, model_parameters=list(model.parameters()), config=cfg,
                               dist_init_required=False)[0]
    late = torch.nn.Linear(16, 16, bias=False)
    late._parameters = dict(late._parameters)
    engine.module.add_module("late", late)
    x = torch.randn(2, 16)
    out = engine(x)
    with dsfast.zero.GatheredParameters(list(model[0].parameters())):
        want = late(x @ model[0].weight.T)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
