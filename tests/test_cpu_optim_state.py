"""CPU optimizers as torch.optim citizens: state dicts moving to and from torch mid-run,
LR schedulers, zero_grad, the fused 16-bit parameter copy (bit-exact RNE cast), the flat
entry points, and the pure-torch reference agreeing with the native op."""
import copy
import importlib

import pytest
import torch

import dsfast.optim as O
from dsfast.optim.cpu_adam import adam_flat_step
from dsfast.optim.cpu_sgd import sgd_flat_step
from _cpu_optim_helpers import EXP_AVG_TOL, PARAM_TOL, STATE_TOL, assert_close, cpu_op, isas

SIZES = [3, 17, 1000]


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).requires_grad_() for n in SIZES]


def grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(n, generator=g) for n in SIZES]


def run(opt, ps, steps, start=0):
    for k in range(start, start + steps):
        for p, g in zip(ps, grads(k)):
            p.grad = g.clone()
        opt.step()


def clone_params(ps):
    return [p.detach().clone().requires_grad_() for p in ps]


CASES = [
    (lambda ps: O.CPUAdam(ps, lr=1e-2, weight_decay=0.1), lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)),
    (lambda ps: O.CPUAdam(ps, lr=1e-2, weight_decay=0.1, adamw_mode=False),
     lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1)),
    (lambda ps: O.CPUSGD(ps, lr=0.05, momentum=0.9, nesterov=True),
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)),
]


def compare_states(a, pa, b, pb):
    for x, y in zip(pa, pb):
        assert_close(x, y, PARAM_TOL, "param")
        sa, sb = a.state[x], b.state[y]
        assert set(sa) == set(sb), f"state keys differ: {set(sa)} vs {set(sb)}"
        for key in sa:
            tol = EXP_AVG_TOL if key in ("exp_avg", "momentum_buffer") else STATE_TOL
            assert_close(torch.as_tensor(sa[key]).float(), torch.as_tensor(sb[key]).float(), tol, key)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_state_dict_round_trip_with_torch(case):
    make_ours, make_torch = CASES[case]
    # ours -> torch mid-run
    pa = params()
    ours = make_ours(pa)
    run(ours, pa, 3)
    sd = ours.state_dict()
    if "step" in sd["state"][0]:
        assert isinstance(sd["state"][0]["step"], torch.Tensor) and float(sd["state"][0]["step"]) == 3
    pb = clone_params(pa)
    theirs = make_torch(pb)
    theirs.load_state_dict(copy.deepcopy(sd))   # as through a checkpoint file: no shared tensors
    run(ours, pa, 3, start=3)
    run(theirs, pb, 3, start=3)
    compare_states(ours, pa, theirs, pb)

    # torch -> ours mid-run
    pc = params(seed=5)
    ref = make_torch(pc)
    run(ref, pc, 3)
    pd = clone_params(pc)
    ours2 = make_ours(pd)
    ours2.load_state_dict(copy.deepcopy(ref.state_dict()))
    run(ref, pc, 3, start=3)
    run(ours2, pd, 3, start=3)
    compare_states(ours2, pd, ref, pc)


def test_lr_scheduler_and_zero_grad():
    pa, pb = params(), None
    pb = clone_params(pa)
    ours, ref = O.CPUAdamW(pa, lr=0.1), torch.optim.AdamW(pb, lr=0.1)
    sa = torch.optim.lr_scheduler.StepLR(ours, step_size=2, gamma=0.1)
    sb = torch.optim.lr_scheduler.StepLR(ref, step_size=2, gamma=0.1)
    for k in range(5):
        for p, q, g in zip(pa, pb, grads(k)):
            p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
        sa.step()
        sb.step()
        assert ours.param_groups[0]["lr"] == pytest.approx(ref.param_groups[0]["lr"])
    for p, q in zip(pa, pb):
        assert_close(p, q, PARAM_TOL, "param under StepLR")
    ours.zero_grad()
    assert all(p.grad is None for p in pa)


def test_params_without_grad_are_skipped():
    pa = params()
    before = [p.detach().clone() for p in pa]
    opt = O.CPUAdam(pa, lr=0.1)
    pa[1].grad = torch.ones_like(pa[1])
    opt.step()
    assert torch.equal(pa[0], before[0]) and torch.equal(pa[2], before[2])
    assert not torch.equal(pa[1], before[1])
    assert len(opt.state[pa[0]]) == 0


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_fused_16bit_copy_is_exact_rne_cast(isa, half):
    pa = params()
    outs = [torch.empty(p.shape, dtype=half) for p in pa]
    adam = O.CPUAdam(pa[:2], lr=1e-2, isa=isa)
    sgd = O.CPUSGD(pa[2:], lr=1e-2, momentum=0.9, isa=isa)
    for k in range(2):
        for p, g in zip(pa, grads(k)):
            p.grad = g
        pa[0].grad[0] = float("nan")
        adam.step(fp16_param_groups=[outs[:2]])
        sgd.step(fp16_param_groups=[outs[2:]])
        for p, o in zip(pa, outs):
            want = p.detach().to(half)
            finite = ~p.detach().isnan()
            assert torch.equal(o[finite].view(torch.int16), want[finite].view(torch.int16)), "16-bit copy != RNE cast"
            assert o[~finite].isnan().all(), "NaN must stay NaN in the 16-bit copy"
    # overflow to inf in fp16, and the RNE tie cases, through the flat entry point
    if half is torch.float16:
        p = torch.tensor([70000.0, -70000.0, 65519.0, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11] * 4)
        out = torch.empty(p.shape, dtype=half)
        sgd_flat_step(p, torch.zeros_like(p), lr=0.0, out16=out, isa=isa)
        assert torch.equal(out.view(torch.int16), p.to(half).view(torch.int16))


@pytest.mark.parametrize("gdtype", [torch.float32, torch.bfloat16, torch.float16])
def test_flat_offload_step_matches_optimizer(gdtype):
    """The engine's path: flat fp32 master + 16-bit grads in + 16-bit params out, one pass.
    150001 elements: spread over several work chunks."""
    n = 150001
    master = torch.randn(n)
    ref = master.clone().requires_grad_()
    m, v, step = torch.zeros(n), torch.zeros(n), torch.tensor(0.0)
    out = torch.empty(n, dtype=torch.bfloat16)
    opt = torch.optim.AdamW([ref], lr=1e-3, weight_decay=0.01)
    for k in range(3):
        g = torch.randn(n).to(gdtype)
        new_step = adam_flat_step(master, g, m, v, step, lr=1e-3, weight_decay=0.01, out16=out)
        assert new_step == k + 1 and float(step) == k + 1
        ref.grad = g.float()
        opt.step()
    assert_close(master, ref.detach(), PARAM_TOL, "flat master")
    assert torch.equal(out.view(torch.int16), master.to(torch.bfloat16).view(torch.int16))


def test_grad_scale_unscales_in_the_kernel():
    op = cpu_op()
    p, q = torch.randn(100), None
    q = p.clone()
    g = torch.randn(100)
    for t, grad, scale in ((p, g * 1024, 1 / 1024), (q, g, 1.0)):
        op.adam_step([t], [grad], [torch.zeros(100)], [torch.zeros(100)], [], [torch.tensor(0.0)],
                     1e-2, 0.9, 0.999, 1e-8, 0.0, True, True, scale, 1, "auto")
    assert_close(p, q, PARAM_TOL, "grad_scale")


def test_reference_module_matches_native():
    """The pure-torch fallback computes the same thing as the kernels."""
    native = cpu_op()
    ref = importlib.import_module("dsfast.ops.reference.cpu_optim")
    if native is ref:
        pytest.skip("native op not built; only the reference is available")
    for mod_args in [("adam", True), ("adam", False), ("sgd", True)]:
        results = []
        for mod in (native, ref):
            torch.manual_seed(0)
            ps = [torch.randn(n) for n in SIZES]
            outs = [torch.empty(n, dtype=torch.bfloat16) for n in SIZES]
            for k in range(3):
                gs = [g.to(torch.bfloat16) for g in grads(k)]
                if mod_args[0] == "adam":
                    if k == 0:
                        ms, vs, st = [torch.zeros(n) for n in SIZES], [torch.zeros(n) for n in SIZES], \
                            [torch.tensor(0.0) for _ in SIZES]
                    mod.adam_step(ps, gs, ms, vs, outs, st, 1e-2, 0.9, 0.99, 1e-8, 0.05, mod_args[1], True, 0.5,
                                  1, "auto")
                else:
                    bufs = bufs if k else [torch.empty(n) for n in SIZES]
                    mod.sgd_step(ps, gs, bufs, outs, [k == 0] * 3, 0.05, 0.9, 0.1, 0.01, False, 1.0, 1, "auto")
            results.append((ps, outs))
        for a, b in zip(results[0][0], results[1][0]):
            assert_close(a, b, PARAM_TOL, f"reference vs native {mod_args}")


def test_cached_tensor_lists_follow_state_changes():
    """The per-group cache of tensor lists must never keep updating tensors the optimizer
    no longer owns: load_state_dict mid-run, a replaced state tensor, a missing grad."""
    pa = params()
    pb = clone_params(pa)
    ours, ref = O.CPUAdam(pa, lr=1e-2), torch.optim.AdamW(pb, lr=1e-2, weight_decay=0.0)
    run(ours, pa, 2)
    run(ref, pb, 2)
    snapshot = copy.deepcopy(ref.state_dict())
    run(ours, pa, 2, start=2)                                # cache in use
    ours.load_state_dict(snapshot)                           # rewind the states to torch's step 2
    for p, q in zip(pa, pb):
        p.data.copy_(q.detach())
    ours.state[pa[1]]["exp_avg"] = ours.state[pa[1]]["exp_avg"].clone()   # a replaced state tensor
    run(ours, pa, 2, start=2)
    run(ref, pb, 2, start=2)
    compare_states(ours, pa, ref, pb)
    pa[0].grad = None                                        # a param without grad this step
    before = pa[0].detach().clone()
    ours.step()
    assert torch.equal(pa[0].detach(), before)
