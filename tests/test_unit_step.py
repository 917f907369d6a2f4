"""optim/amp_step.py prepare_step, the per-unit entry ZeRO's walk steps shard units through: stepping the
parameters in batches (one at a time, in any order) gives each the update of one whole amp_step, bit for bit; the
hyperparameters are validated once per step, not per batch; dsfast's CPU optimizers never rewrite param_groups
nor call step() per batch; a skipped step writes nothing; other optimizers are narrowed to the batch and restored."""
import random

import pytest
import torch

from dsfast.optim import CPUAdagrad, CPUAdam, CPUAdam8bit, CPULion, CPUSGD, FusedAdam, FusedSGD
from dsfast.optim.amp_step import amp_step, prepare_step

CPU = {
    "adam": lambda ps: CPUAdam(ps, lr=1e-2, weight_decay=0.1),
    "adam8bit": lambda ps: CPUAdam8bit(ps, lr=1e-2),
    "sgd": lambda ps: CPUSGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
    "adagrad": lambda ps: CPUAdagrad(ps, lr=1e-2),
    "lion": lambda ps: CPULion(ps, lr=1e-3, weight_decay=0.1),
}
FUSED = {   # (on CPU tensors: their reference kernels)
    "fused_adam": lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.1),
    "fused_sgd": lambda ps: FusedSGD(ps, lr=1e-2, momentum=0.9, dampening=0.1),
}
OURS = {**CPU, **FUSED}
TORCH = {"torch_adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)}


def _setup(make, seed=0):
    """An optimizer over two param groups (sizes of ZeRO units), with bf16 gradients and bf16 outputs."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(n, generator=g)) for n in (300, 17, 64, 1, 129)]
    opt = make([{"params": params[:3]}, {"params": params[3:], "lr": 3e-3}])
    return opt, params


def _grads(opt, step):
    g = torch.Generator().manual_seed(100 + step)
    return [[torch.randn(p.numel(), generator=g).to(torch.bfloat16) for p in group["params"]]
            for group in opt.param_groups]


def _outs(opt):
    return [[torch.empty(p.numel(), dtype=torch.bfloat16) for p in group["params"]] for group in opt.param_groups]


def _state(opt):
    return [{k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[p].items()}
            for group in opt.param_groups for p in group["params"]]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            _same(list(x.values()), list(y.values()))
        elif torch.is_tensor(x):
            assert torch.equal(x, y)
        else:
            assert x == y


def _walk(opt, grads, outs, kw, order):
    """One step through prepare_step, one parameter per batch, in `order` ((group, index) pairs)."""
    step = prepare_step(opt, **kw)
    for gi, j in order:
        parts = [([], [], []) for _ in opt.param_groups]
        parts[gi] = ([j], [grads[gi][j]], [outs[gi][j]])
        step(parts)


@pytest.mark.parametrize("name", list(OURS) + list(TORCH))
def test_one_parameter_at_a_time_in_any_order_is_the_whole_step_bitwise(name):
    make = {**OURS, **TORCH}[name]
    whole, pw = _setup(make)
    walked, pu = _setup(make)
    order = [(gi, j) for gi, g in enumerate(whole.param_groups) for j in range(len(g["params"]))]
    kw = dict(grad_scale=torch.tensor(4.0), found_inf=torch.tensor(0.0), clip_coef=torch.tensor(0.5))
    for step in range(3):
        grads = _grads(whole, step)
        outs_w, outs_u = _outs(whole), _outs(walked)
        amp_step(whole, grads=grads, out16=outs_w, **kw)
        random.Random(step).shuffle(order)
        _walk(walked, grads, outs_u, kw, order)
        _same([p.detach() for p in pw], [p.detach() for p in pu])
        _same(_state(whole), _state(walked))
        _same([o for g in outs_w for o in g], [o for g in outs_u for o in g])


@pytest.mark.parametrize("name", list(OURS))
def test_dsfast_optimizers_validate_once_and_never_rewrite_groups_nor_call_step(name, monkeypatch):
    opt, _ = _setup(OURS[name])
    calls = []
    real = type(opt)._group_hyperparameters
    monkeypatch.setattr(type(opt), "_group_hyperparameters", lambda self, g: calls.append(1) or real(self, g))
    monkeypatch.setattr(type(opt), "step", lambda *a, **k: pytest.fail("step() called per batch"))
    lists = [g["params"] for g in opt.param_groups]
    grads = _grads(opt, 0)
    order = [(gi, j) for gi, g in enumerate(opt.param_groups) for j in range(len(g["params"]))]
    _walk(opt, grads, _outs(opt), {}, order)
    assert len(calls) == len(opt.param_groups)   # once per group for the whole step, not once per parameter
    assert all(g["params"] is kept for g, kept in zip(opt.param_groups, lists))
    assert len(opt.state) == 5


def test_a_bad_hyperparameter_is_refused_before_any_parameter_is_stepped():
    opt, params = _setup(CPU["adam"])
    before = [p.detach().clone() for p in params]
    opt.param_groups[1]["lr"] = -1.0
    with pytest.raises(ValueError, match=r"lr=-1.0; it must be >= 0"):
        prepare_step(opt)
    _same(before, [p.detach() for p in params])
    assert len(opt.state) == 0


@pytest.mark.parametrize("name", list(OURS) + list(TORCH))
def test_a_skipped_step_writes_nothing(name):
    opt, params = _setup({**OURS, **TORCH}[name])
    before = [p.detach().clone() for p in params]
    grads, outs = _grads(opt, 0), _outs(opt)
    _walk(opt, grads, outs, dict(found_inf=torch.tensor(1.0)), [(0, 0), (1, 1)])
    _same(before, [p.detach() for p in params])
    if name in CPU:   # the CPU kernels read the flag on the host and touch nothing (the fused ones skip in-kernel)
        assert len(opt.state) == 0
    else:
        assert all(int(st["step"]) == 0 for st in opt.state.values() if "step" in st)


def test_a_narrowed_optimizer_gets_its_groups_back_even_when_its_step_fails():
    opt, params = _setup(TORCH["torch_adamw"])
    lists = [list(g["params"]) for g in opt.param_groups]
    grads = _grads(opt, 0)
    parts = [([1], [grads[0][1]], None), ([], [], None)]

    def failing(*a, **k):
        assert [len(g["params"]) for g in opt.param_groups] == [1, 0]   # narrowed to the batch for the call
        raise RuntimeError("boom")
    opt.step = failing
    with pytest.raises(RuntimeError, match="boom"):
        prepare_step(opt)(parts)
    assert [list(g["params"]) for g in opt.param_groups] == lists
