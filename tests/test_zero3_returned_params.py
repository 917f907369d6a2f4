"""ZeRO stage 3 modules that hand a parameter to their caller: a layer returning its own bias for the caller to add
(DeepSpeed's test_zero_context_return, Megatron's skip_bias_add) finds it whole after the layer's forward, trains
exactly as torch does, and it is released when the caller's forward ends. Also a wrapper module that delegates
attribute lookups to the module it wraps (DeepSpeed's test_zero_hook_attribute_delegation) trains as torch does."""
import torch

import dsfast
from dsfast.runtime.zero import ZeroParamStatus

CFG = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.0, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
       "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}


class BiasReturning(torch.nn.Linear):
    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight), self.bias


class Caller(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(8, 8)
        self.layer = BiasReturning(8, 8)
        self.seen = []

    def forward(self, x):
        out, bias = self.layer(self.first(x))
        self.seen.append(bias.ds_status if hasattr(bias, "ds_status") else None)
        return (out + bias).pow(2).sum()


class Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = Caller()

    def forward(self, x):
        return self.inner(x)


class Delegating(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.wrapped = module

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("wrapped"), name)

    def forward(self, x):
        return self.wrapped(x)


class WrapperModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.input = torch.nn.Linear(8, 8)
        self.output = Delegating(torch.nn.Linear(8, 8))

    def forward(self, x):
        return self.output(self.input(x)).pow(2).sum()


def _train(model, steps=4):
    """(the model's parameters after `steps` steps, as dsfast at stage 3 and as torch's Adam)"""
    ref = type(model)()
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=CFG,
                               dist_init_required=False)[0]
    for step in range(steps):
        x = torch.randn(1, 8, generator=torch.Generator().manual_seed(step))
        engine.backward(engine(x))
        engine.step()
        opt.zero_grad()
        ref(x).backward()
        opt.step()
    with dsfast.zero.GatheredParameters(list(model.parameters())):
        got = [p.detach().clone() for p in model.parameters()]
    return got, [p.detach() for p in ref.parameters()]


def test_a_returned_parameter_is_whole_for_the_caller_and_trains_as_torch():
    model = Outer()
    got, want = _train(model)
    assert model.inner.seen == [ZeroParamStatus.AVAILABLE] * 4
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert model.inner.layer.bias.ds_status is ZeroParamStatus.NOT_AVAILABLE   # released with the caller


def test_an_attribute_delegating_wrapper_trains_as_torch():
    got, want = _train(WrapperModel())
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
