"""Parity of dsfast's CPU Adam/AdamW/SGD with torch.optim after several steps: all sizes that
hit the vector tails, several param groups with different hyperparameters, weight decay on and
off, every gradient dtype and every ISA body this CPU runs. Tolerances: _cpu_optim_helpers."""
import pytest
import torch

import dsfast.optim as O
from dsfast.optim.cpu_adam import adam_flat_step
from dsfast.optim.cpu_sgd import sgd_flat_step
from _cpu_optim_helpers import EXP_AVG_TOL, PARAM_TOL, STATE_TOL, assert_close, cpu_op, grads_as, isas

SIZES = [1, 7, 8, 15, 16, 17, 4097]
STEPS = 4
ISAS = isas()

# (group 0 sizes, group 1 sizes) with different hyperparameters per group
ADAM_GROUPS = [dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8), dict(lr=3e-3, betas=(0.8, 0.99), eps=1e-6)]


def make_params(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for n in sizes]


def grad_seq(sizes, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(n, generator=g) for n in sizes] for _ in range(steps)]


def adam_torch_groups(params, wd, adamw, bias_correction):
    groups = [dict(params=params[:4], weight_decay=wd, **ADAM_GROUPS[0]),
              dict(params=params[4:], weight_decay=wd * 0.5, **ADAM_GROUPS[1])]
    return groups


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("adamw,wd", [(True, 0.1), (False, 0.1), (True, 0.0)])
def test_adam_optimizer_matches_torch(isa, adamw, wd):
    ours_p = [p.requires_grad_() for p in make_params(SIZES)]
    ref_p = [p.detach().clone().requires_grad_() for p in ours_p]
    ours = O.CPUAdam(adam_torch_groups(ours_p, wd, adamw, True), adamw_mode=adamw, isa=isa)
    ref = (torch.optim.AdamW if adamw else torch.optim.Adam)(adam_torch_groups(ref_p, wd, adamw, True))
    for grads in grad_seq(SIZES, STEPS):
        for p, q, g in zip(ours_p, ref_p, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    for i, (p, q) in enumerate(zip(ours_p, ref_p)):
        assert_close(p, q, PARAM_TOL, f"param {i} (n={p.numel()})")
        for key, tol in (("exp_avg", EXP_AVG_TOL), ("exp_avg_sq", STATE_TOL)):
            assert_close(ours.state[p][key], ref.state[q][key], tol, f"{key} {i}")
        assert float(ours.state[p]["step"]) == float(ref.state[q]["step"]) == STEPS


@pytest.mark.parametrize("isa", ISAS)
def test_adam_without_bias_correction(isa):
    # torch has no switch for this: compare with a direct fp64 transcription of the rule
    p0 = make_params([17])[0]
    p = p0.clone().requires_grad_()
    opt = O.CPUAdam([p], lr=1e-2, bias_correction=False, weight_decay=0.0, isa=isa)
    P, M, V = p0.double(), torch.zeros(17, dtype=torch.float64), torch.zeros(17, dtype=torch.float64)
    for (g,) in grad_seq([17], STEPS):
        p.grad = g.clone()
        opt.step()
        G = g.double()
        M = 0.9 * M + 0.1 * G
        V = 0.999 * V + 0.001 * G * G
        P = P - 1e-2 * M / (V.sqrt() + 1e-8)
    assert_close(p.detach().double(), P, PARAM_TOL, "param without bias correction")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("momentum,dampening,nesterov,wd", [(0.0, 0.0, False, 0.0), (0.9, 0.1, False, 0.01),
                                                             (0.9, 0.0, True, 0.01)])
def test_sgd_optimizer_matches_torch(isa, momentum, dampening, nesterov, wd):
    ours_p = [p.requires_grad_() for p in make_params(SIZES)]
    ref_p = [p.detach().clone().requires_grad_() for p in ours_p]

    def groups(ps):
        return [dict(params=ps[:4], lr=0.05, weight_decay=wd),
                dict(params=ps[4:], lr=0.01, weight_decay=0.0, momentum=momentum * 0.5 if momentum else 0.0)]
    ours = O.CPUSGD(groups(ours_p), momentum=momentum, dampening=dampening, nesterov=nesterov, isa=isa)
    ref = torch.optim.SGD(groups(ref_p), momentum=momentum, dampening=dampening, nesterov=nesterov)
    for grads in grad_seq(SIZES, STEPS):
        for p, q, g in zip(ours_p, ref_p, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    for i, (p, q) in enumerate(zip(ours_p, ref_p)):
        assert_close(p, q, PARAM_TOL, f"param {i}")
        if momentum:
            assert_close(ours.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"], PARAM_TOL, f"buf {i}")
        else:
            assert "momentum_buffer" not in ours.state[p]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("gdtype", [torch.bfloat16, torch.float16])
def test_adam_op_reads_16bit_grads(isa, gdtype):
    """Gradients in bf16/fp16 are read directly; torch gets the same values upcast."""
    op = cpu_op()
    ps = make_params(SIZES)
    refs = [p.clone().requires_grad_() for p in ps]
    ms = [torch.zeros_like(p) for p in ps]
    vs = [torch.zeros_like(p) for p in ps]
    steps = [torch.tensor(0.0) for _ in ps]
    ref = torch.optim.AdamW(refs, lr=1e-2, weight_decay=0.1)
    for grads in grad_seq(SIZES, STEPS):
        low, exact = grads_as(gdtype, grads)
        op.adam_step(ps, low, ms, vs, [], steps, 1e-2, 0.9, 0.999, 1e-8, 0.1, True, True, 1.0, 2, isa)
        for q, g in zip(refs, exact):
            q.grad = g
        ref.step()
    for i, (p, q) in enumerate(zip(ps, refs)):
        assert_close(p, q.detach(), PARAM_TOL, f"param {i} with {gdtype} grads")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("gdtype", [torch.bfloat16, torch.float16])
def test_sgd_op_reads_16bit_grads(isa, gdtype):
    op = cpu_op()
    ps = make_params(SIZES)
    refs = [p.clone().requires_grad_() for p in ps]
    bufs = [torch.empty_like(p) for p in ps]
    ref = torch.optim.SGD(refs, lr=0.05, momentum=0.9, weight_decay=0.01)
    for k, grads in enumerate(grad_seq(SIZES, STEPS)):
        low, exact = grads_as(gdtype, grads)
        op.sgd_step(ps, low, bufs, [], [k == 0] * len(ps), 0.05, 0.9, 0.0, 0.01, False, 1.0, 2, isa)
        for q, g in zip(refs, exact):
            q.grad = g
        ref.step()
    for i, (p, q) in enumerate(zip(ps, refs)):
        assert_close(p, q.detach(), PARAM_TOL, f"param {i} with {gdtype} grads")


@pytest.mark.parametrize("isa,gdtype,opt", [(ISAS[0], torch.float32, "adamw"), (ISAS[-1], torch.bfloat16, "adam"),
                                            (ISAS[0], torch.float16, "sgd")])
def test_large_flat_partition(isa, gdtype, opt):
    """1M+3 elements: the multi-threaded split with a ragged tail, through the flat entry points."""
    n = (1 << 20) + 3
    p0 = make_params([n])[0]
    p = p0.clone()
    q = p0.clone().requires_grad_()
    if opt == "sgd":
        buf = torch.empty(n)
        ref = torch.optim.SGD([q], lr=0.05, momentum=0.9, nesterov=True)
    else:
        m, v, step = torch.zeros(n), torch.zeros(n), torch.tensor(0.0)
        ref = (torch.optim.AdamW if opt == "adamw" else torch.optim.Adam)([q], lr=1e-3, weight_decay=0.05)
    for k, (g,) in enumerate(grad_seq([n], 3)):
        low, exact = grads_as(gdtype, [g])
        if opt == "sgd":
            sgd_flat_step(p, low[0], buf, lr=0.05, momentum=0.9, nesterov=True, first_step=k == 0, isa=isa)
        else:
            adam_flat_step(p, low[0], m, v, step, lr=1e-3, weight_decay=0.05, adamw=opt == "adamw",
                                      isa=isa)
        q.grad = exact[0]
        ref.step()
    assert_close(p, q.detach(), PARAM_TOL, f"{opt} 1M+3 {gdtype}")


@pytest.mark.parametrize("isa", ISAS)
def test_nonfinite_grads_behave_like_torch(isa):
    g0 = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0, 0.5, -2.0, 3.0, 0.1, 0.2] + [0.3] * 8)
    for cls, ref_cls, kw in [(O.CPUAdam, torch.optim.AdamW, dict(weight_decay=0.01)),
                             (O.CPUSGD, torch.optim.SGD, dict(momentum=0.9))]:
        p = torch.ones(17, requires_grad=True)
        q = torch.ones(17, requires_grad=True)
        ours, ref = cls([p], lr=0.1, isa=isa, **kw), ref_cls([q], lr=0.1, **kw)
        for g in (g0, torch.full((17,), 0.5)):   # a finite step after the bad one
            p.grad, q.grad = g.clone(), g.clone()
            ours.step()
            ref.step()
        assert_close(p, q, PARAM_TOL, f"{cls.__name__} after non-finite grads")
        assert torch.equal(p.isnan(), q.isnan()) and torch.equal(p.isinf(), q.isinf())


@pytest.mark.parametrize("cls,ref_cls,kw", [(O.CPUAdamW, torch.optim.AdamW, dict(weight_decay=0.1)),
                                            (O.CPUSGD, torch.optim.SGD, dict(momentum=0.9, weight_decay=0.01))])
def test_maximize_matches_torch(cls, ref_cls, kw):
    ours_p = [p.requires_grad_() for p in make_params(SIZES)]
    ref_p = [p.detach().clone().requires_grad_() for p in ours_p]
    ours, ref = cls(ours_p, lr=1e-2, maximize=True, **kw), ref_cls(ref_p, lr=1e-2, maximize=True, **kw)
    for grads in grad_seq(SIZES, STEPS):
        for p, q, g in zip(ours_p, ref_p, grads):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    for i, (p, q) in enumerate(zip(ours_p, ref_p)):
        assert_close(p, q, PARAM_TOL, f"maximize param {i}")
