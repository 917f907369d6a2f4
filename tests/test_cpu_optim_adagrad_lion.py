"""CPUAdagrad (DeepSpeedCPUAdagrad) and CPULion (DeepSpeedCPULion): parity with torch.optim.Adagrad and with the Lion
paper's algorithm written below in torch, over several steps, sizes around every SIMD width, two param groups, every
ISA body this CPU runs; 16-bit gradients, masters, states and outputs; state dicts; refused hyperparameters; the
pure-torch reference op against the native one. Tolerances: _cpu_optim_helpers (fp32 math on both sides)."""
import copy
import importlib

import pytest
import torch

import dsfast.optim as O
from _cpu_optim_helpers import PARAM_TOL, STATE_TOL, assert_close, cpu_op, grads_as, isas

SIZES = [1, 7, 15, 17, 33, 4097]   # none a multiple of 8 or 16 but 0 elements: every body's tail
STEPS = 4
ISAS = isas()


def make_params(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).requires_grad_() for n in sizes]


def grad_seq(sizes, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(n, generator=g) for n in sizes] for _ in range(steps)]


def clone(ps):
    return [p.detach().clone().requires_grad_() for p in ps]


def run(opt, ps, grads):
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()


class PaperLion(torch.optim.Optimizer):
    """Lion as the paper's Algorithm 2, in fp32 torch: update = sign(beta1 m + (1 - beta1) g); p -= lr (update +
    wd p) with the decay taken first (p *= 1 - lr wd); m = beta2 m + (1 - beta2) g."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0, maximize=False):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize))
        self.ties = {}   # param -> elements whose interpolation (nearly) cancelled at some step

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                g = -p.grad if group["maximize"] else p.grad
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                a, b = m * b1, g * (1 - b1)
                c = a + b
                tie = (a + b).abs() <= 1e-6 * (a.abs() + b.abs())
                self.ties[p] = self.ties.get(p, torch.zeros_like(tie)) | tie
                p.mul_(1 - group["lr"] * group["weight_decay"]).add_(c.sign(), alpha=-group["lr"])
                m.mul_(b2).add_(g, alpha=1 - b2)


def assert_lion_close(ours, ref, p, q, what):
    """Parameters and momenta equal within PARAM_TOL, except where the reference's interpolation nearly cancelled
    (the sign then depends on a fused multiply-add): those are allowed any sign, within 2 lr per step."""
    tie = ref.ties.get(q, torch.zeros(p.shape, dtype=torch.bool))
    assert int(tie.sum()) <= max(1, p.numel() // 100), f"{what}: too many near-ties to test anything"
    assert_close(p.detach()[~tie], q.detach()[~tie], PARAM_TOL, f"{what} param")
    assert_close(ours.state[p]["exp_avg"], ref.state[q]["exp_avg"], STATE_TOL, f"{what} exp_avg")


def adagrad_groups(ps, wd):
    return [dict(params=ps[:3], lr=0.05, weight_decay=wd), dict(params=ps[3:], lr=0.01, eps=1e-6,
                                                                  weight_decay=wd / 2)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adagrad_matches_torch(isa, wd):
    ours_p = make_params(SIZES)
    ref_p = clone(ours_p)
    ours = O.CPUAdagrad(adagrad_groups(ours_p, wd), isa=isa)
    ref = torch.optim.Adagrad(adagrad_groups(ref_p, wd), eps=1e-10, lr_decay=0, initial_accumulator_value=0)
    grads = grad_seq(SIZES, STEPS)
    run(ours, ours_p, grads)
    run(ref, ref_p, grads)
    for i, (p, q) in enumerate(zip(ours_p, ref_p)):
        assert_close(p, q, PARAM_TOL, f"param {i} (n={p.numel()})")
        assert_close(ours.state[p]["exp_avg_sq"], ref.state[q]["sum"], STATE_TOL, f"sum {i}")
        assert float(ours.state[p]["step"]) == float(ref.state[q]["step"]) == STEPS


def lion_groups(ps, wd):
    return [dict(params=ps[:3], lr=1e-2, betas=(0.9, 0.99), weight_decay=wd),
            dict(params=ps[3:], lr=3e-3, betas=(0.95, 0.98), weight_decay=wd * 2)]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_lion_matches_the_paper(isa, wd):
    ours_p = make_params(SIZES)
    ref_p = clone(ours_p)
    ours = O.CPULion(lion_groups(ours_p, wd), isa=isa)
    ref = PaperLion(lion_groups(ref_p, wd))
    grads = grad_seq(SIZES, STEPS)
    run(ours, ours_p, grads)
    run(ref, ref_p, grads)
    for i, (p, q) in enumerate(zip(ours_p, ref_p)):
        assert_lion_close(ours, ref, p, q, f"lion {i} (n={p.numel()})")
        assert float(ours.state[p]["step"]) == STEPS
        assert set(ours.state[p]) == {"step", "exp_avg"}


def test_lion_moves_every_element_by_lr_and_zero_interpolation_by_nothing():
    # |update| is exactly lr where sign(c) is +-1; a zero gradient on a zero momentum is sign 0 (torch.sign)
    p = torch.nn.Parameter(torch.arange(37, dtype=torch.float32))
    opt = O.CPULion([p], lr=0.25)
    g = torch.randn(37)
    g[[0, 16, 36]] = 0.0
    p.grad = g
    before = p.detach().clone()
    opt.step()
    want = before - 0.25 * g.sign()
    assert torch.equal(p.detach(), want)


@pytest.mark.parametrize("cls,ref_cls,kw", [
    (O.CPUAdagrad, torch.optim.Adagrad, dict(lr=0.05, weight_decay=0.1)),
    (O.CPULion, PaperLion, dict(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1)),
])
def test_maximize_ascends(cls, ref_cls, kw):
    ours_p = make_params([17, 33])
    ref_p = clone(ours_p)
    ours, ref = cls(ours_p, maximize=True, **kw), ref_cls(ref_p, maximize=True, **kw)
    run(ours, ours_p, grad_seq([17, 33], 3))
    run(ref, ref_p, grad_seq([17, 33], 3))
    for p, q in zip(ours_p, ref_p):
        if ref_cls is PaperLion:
            assert_lion_close(ours, ref, p, q, "lion maximize")
        else:
            assert_close(p, q, PARAM_TOL, "adagrad maximize")


@pytest.mark.parametrize("gdtype", [torch.bfloat16, torch.float16])
def test_16bit_gradients_are_read_as_they_are(gdtype):
    ours_p = make_params([17, 4097])
    ref_p = clone(ours_p)
    ours, ref = O.CPUAdagrad(ours_p, lr=0.05), torch.optim.Adagrad(ref_p, lr=0.05)
    lion_p, lion_ref_p = clone(ours_p), clone(ours_p)
    lion, lion_ref = O.CPULion(lion_p, lr=0.01, betas=(0.9, 0.99)), PaperLion(lion_ref_p, lr=0.01)
    for gs in grad_seq([17, 4097], 3):
        low, exact = grads_as(gdtype, gs)
        for ps in (ref_p, lion_ref_p):
            for p, g in zip(ps, exact):
                p.grad = g
        ours.step(grads=[low])   # a 16-bit gradient beside an fp32 master: the amp contract's grads (torch
        lion.step(grads=[low])   # refuses it as .grad), as the engine passes them
        ref.step()
        lion_ref.step()
    for p, q in zip(ours_p, ref_p):
        assert_close(p, q, PARAM_TOL, f"adagrad with {gdtype} grads")
    for p, q in zip(lion_p, lion_ref_p):
        assert_lion_close(lion, lion_ref, p, q, f"lion with {gdtype} grads")


@pytest.mark.parametrize("cls", [O.CPUAdagrad, O.CPULion])
@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_fused_16bit_copy_is_the_rne_cast_of_the_update(cls, half):
    ps = make_params([17, 33])
    opt = cls(ps, lr=1e-2)
    outs = [torch.zeros(p.numel(), dtype=half) for p in ps]
    for gs in grad_seq([17, 33], 2):
        for p, g in zip(ps, gs):
            p.grad = g
        opt.step(fp16_param_groups=[outs])
    for p, o in zip(ps, outs):
        assert torch.equal(o, p.detach().to(half))


@pytest.mark.parametrize("cls,key,kw", [(O.CPUAdagrad, "exp_avg_sq", dict(lr=0.05, weight_decay=0.01)),
                                        (O.CPULion, "exp_avg", dict(lr=1e-2, weight_decay=0.1))])
@pytest.mark.parametrize("pdtype,fp32_states", [(torch.bfloat16, True), (torch.bfloat16, False),
                                                (torch.float16, False)])
def test_16bit_masters_and_states_round_the_fp32_update(cls, key, kw, pdtype, fp32_states):
    """A 16-bit master is stepped in place: each stored value is the fp32 update of the stored values, rounded to
    nearest even (one unit in the last place allowed: fused multiply-adds)."""
    ps = [p.detach().to(pdtype) for p in make_params([17, 4097])]
    opt = cls(ps, fp32_optimizer_states=fp32_states, **kw)
    gs = [g.to(pdtype) for g in grad_seq([17, 4097], 1)[0]]
    for p, g in zip(ps, gs):
        p.grad = g
    opt.step()   # states now hold something nonzero
    before = [(p.detach().float(), opt.state[p][key].float().clone()) for p in ps]
    for p, g in zip(ps, gs):
        p.grad = g
    opt.step()
    ulp = 2.0 ** -7 if pdtype == torch.bfloat16 else 2.0 ** -10
    for (p0, s0), p, g in zip(before, ps, gs):
        assert opt.state[p][key].dtype == (torch.float32 if fp32_states else pdtype)
        p32, s32 = p0.clone(), s0.clone()
        ref_op = importlib.import_module("dsfast.ops.reference.cpu_optim")
        step = [torch.tensor(1.0)]
        if cls is O.CPUAdagrad:
            ref_op.adagrad_step([p32], [g], [s32], [], step, kw["lr"], 1e-10, kw["weight_decay"])
        else:
            ref_op.lion_step([p32], [g], [s32], [], step, kw["lr"], 0.9, 0.999, kw["weight_decay"])
        got, want = p.detach().float(), p32.to(pdtype).float()
        if cls is O.CPULion:   # a (nearly) cancelling interpolation may take either sign: see assert_lion_close
            a, b = 0.9 * s0, 0.1 * g.float()
            keep = (a + b).abs() > 1e-6 * (a.abs() + b.abs())
            got, want = got[keep], want[keep]
        torch.testing.assert_close(got, want, rtol=ulp * 1.01, atol=1e-6)


def test_state_dict_round_trip_continues_identically():
    for cls, kw in ((O.CPUAdagrad, dict(lr=0.05, weight_decay=0.1)), (O.CPULion, dict(lr=1e-2, weight_decay=0.1))):
        a_p = make_params(SIZES)
        b_p = clone(a_p)
        a = cls(a_p, **kw)
        run(a, a_p, grad_seq(SIZES, 2))
        for p, q in zip(a_p, b_p):
            q.data.copy_(p.detach())
        b = cls(b_p, **kw)
        b.load_state_dict(copy.deepcopy(a.state_dict()))   # as saved and loaded (torch shares the step tensors)
        later = grad_seq(SIZES, 2, seed=7)
        run(a, a_p, later)
        run(b, b_p, later)
        for p, q in zip(a_p, b_p):
            assert torch.equal(p, q), cls.__name__
            assert b.state[q]["step"].dtype == torch.float32 and float(b.state[q]["step"]) == 4


def test_adagrad_loads_torch_adagrad_state_mid_run():
    ref_p = make_params(SIZES)
    ours_p = clone(ref_p)
    ref = torch.optim.Adagrad(ref_p, lr=0.05, weight_decay=0.1)
    run(ref, ref_p, grad_seq(SIZES, 2))
    for p, q in zip(ours_p, ref_p):
        p.data.copy_(q.detach())
    ours = O.CPUAdagrad(ours_p, lr=0.05, weight_decay=0.1)
    ours.load_state_dict(ref.state_dict())
    later = grad_seq(SIZES, 2, seed=3)
    run(ref, ref_p, later)
    run(ours, ours_p, later)
    for p, q in zip(ours_p, ref_p):
        assert_close(p, q, PARAM_TOL, "after loading torch's Adagrad state")
        assert_close(ours.state[p]["exp_avg_sq"], ref.state[q]["sum"], STATE_TOL, "sum")


def test_lion_loads_deepspeed_s_state_layout():
    """DeepSpeedCPULion's state: an int step, exp_avg, and an exp_avg_sq it never reads (dropped here)."""
    ps = make_params([17])
    opt = O.CPULion(ps, lr=1e-2)
    m = torch.randn(17)
    sd = opt.state_dict()
    sd["state"] = {0: {"step": 3, "exp_avg": m.clone(), "exp_avg_sq": torch.zeros(17)}}
    opt.load_state_dict(sd)
    st = opt.state[ps[0]]
    assert set(st) == {"step", "exp_avg"} and float(st["step"]) == 3 and torch.equal(st["exp_avg"], m)
    ps[0].grad = torch.randn(17)
    opt.step()
    assert float(st["step"]) == 4


def test_a_state_without_the_optimizer_s_key_is_refused_naming_the_param():
    ps = make_params([5, 6])
    opt = O.CPULion(ps)
    opt.state[ps[1]]["momentum_buffer"] = torch.zeros(6)
    for p in ps:
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[1\].*'exp_avg'"):
        opt.step()


def _p(n=8):
    return torch.zeros(n, requires_grad=True)


@pytest.mark.parametrize("cls,kwargs,exc,words", [
    (O.CPUAdagrad, dict(lr=-1.0), ValueError, ["lr", "-1.0"]),
    (O.CPUAdagrad, dict(lr="fast"), TypeError, ["lr", "fast"]),
    (O.CPUAdagrad, dict(eps=0.0), ValueError, ["eps", "0.0"]),
    (O.CPUAdagrad, dict(eps=float("inf")), ValueError, ["eps", "inf"]),
    (O.CPUAdagrad, dict(weight_decay=-0.1), ValueError, ["weight_decay", "-0.1"]),
    (O.CPUAdagrad, dict(amsgrad=True), ValueError, ["amsgrad"]),
    (O.CPUAdagrad, dict(isa="sse9"), ValueError, ["isa", "sse9"]),
    (O.CPULion, dict(lr=-1e-3), ValueError, ["lr", "-0.001"]),
    (O.CPULion, dict(betas=(1.0, 0.99)), ValueError, ["beta1", "1.0", "[0, 1)"]),
    (O.CPULion, dict(betas=(0.9, -0.1)), ValueError, ["beta2", "-0.1"]),
    (O.CPULion, dict(betas=0.9), TypeError, ["betas"]),
    (O.CPULion, dict(weight_decay=float("nan")), ValueError, ["weight_decay", "nan"]),
    (O.CPULion, dict(isa=3), TypeError, ["isa"]),
])
def test_bad_hyperparameters_are_refused_naming_the_argument(cls, kwargs, exc, words):
    with pytest.raises(exc) as e:
        cls([_p()], **kwargs)
    for w in words:
        assert w in str(e.value), f"{w!r} missing from: {e.value}"


@pytest.mark.parametrize("cls,key,value,word", [
    (O.CPUAdagrad, "lr", -0.1, "lr"), (O.CPUAdagrad, "lr_decay", 0.01, "lr_decay"),
    (O.CPUAdagrad, "initial_accumulator_value", 0.1, "initial_accumulator_value"),
    (O.CPULion, "betas", (0.9, 1.5), "beta2"), (O.CPULion, "weight_decay", -1.0, "weight_decay"),
])
def test_bad_group_setting_is_caught_at_step_before_any_update(cls, key, value, word):
    p = _p()
    opt = cls([p])
    opt.param_groups[0][key] = value
    p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match=word):
        opt.step()
    assert torch.equal(p.detach(), torch.zeros(8)) and not opt.state[p].get("step", 0)


@pytest.mark.parametrize("cls", [O.CPUAdagrad, O.CPULion])
def test_bad_tensors_are_refused_naming_the_parameter(cls):
    good, bad = _p(), torch.zeros(4, 4, requires_grad=True)
    opt = cls([good, bad])
    ones = torch.ones_like(good)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[1\]\.grad is not contiguous"):
        opt.step(grads=[[ones, torch.ones(4, 4).t()]])
    assert torch.equal(good.detach(), torch.zeros(8)), "nothing is updated when one tensor is refused"
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['params'\]\[1\]\.grad has dtype .*(double|float64)"):
        opt.step(grads=[[ones, torch.ones(4, 4, dtype=torch.float64)]])
    with pytest.raises(ValueError, match=r"\[1\]\.grad has shape \[16\] but the parameter has shape \[4, 4\]"):
        opt.step(grads=[[ones, torch.ones(16)]])
    assert torch.equal(good.detach(), torch.zeros(8))


@pytest.mark.parametrize("kind", ["adagrad", "lion"])
@pytest.mark.parametrize("master", [torch.float32, torch.bfloat16])
def test_reference_op_matches_native(kind, master):
    """The pure-torch fallback computes what the kernels do: fp32 masters with 16-bit outputs, bf16 masters with bf16
    states, bf16 grads, a grad scale, distinct step counts."""
    native = cpu_op()
    ref = importlib.import_module("dsfast.ops.reference.cpu_optim")
    if native is ref:
        pytest.skip("native op not built; only the reference is available")
    sizes = [3, 17, 4097]
    results = []
    for mod in (native, ref):
        torch.manual_seed(0)
        ps = [torch.randn(n).to(master) for n in sizes]
        states = [(torch.rand(n) if kind == "adagrad" else torch.randn(n)).to(master) for n in sizes]
        outs = [torch.empty(n, dtype=torch.float16) for n in sizes] if master == torch.float32 else []
        steps = [torch.tensor(float(i)) for i in range(3)]
        for k in range(3):
            gs = [g.to(torch.bfloat16) for g in grad_seq(sizes, 1, seed=10 + k)[0]]
            if kind == "adagrad":
                mod.adagrad_step(ps, gs, states, outs, steps, 0.05, 1e-10, 0.01, 0.5, 1, "auto")
            else:
                mod.lion_step(ps, gs, states, outs, steps, 1e-2, 0.9, 0.99, 0.1, 0.5, 1, "auto")
        results.append((ps, states, outs, steps))
    (pa, sa, oa, ta), (pb, sb, ob, tb) = results
    # bf16: one unit in the last place (a fused multiply-add may round the other way); lion: see assert_lion_close
    tol = PARAM_TOL if master == torch.float32 else dict(rtol=2 ** -7, atol=1e-6)
    for i in range(3):
        a, b = pa[i].float(), pb[i].float()
        if kind == "lion":
            keep = (a - b).abs() <= 2 * 1e-2 * 3 + 1e-6   # each of 3 steps may flip one sign
            assert int((~keep).sum()) == 0 and int(((a - b).abs() > 1e-4).sum()) <= max(1, a.numel() // 100)
            a, b = a[(a - b).abs() <= 1e-4], b[(a - b).abs() <= 1e-4]
        assert_close(a, b, tol, f"{kind} param {i}")
        assert_close(sa[i].float(), sb[i].float(), STATE_TOL if master == torch.float32 else tol, f"{kind} state {i}")
        assert float(ta[i]) == float(tb[i]) == i + 3
    for a, b in zip(oa, ob):
        assert_close(a.float(), b.float(), dict(rtol=2 ** -10, atol=1e-6), f"{kind} 16-bit output")


def test_opcheck_adagrad_and_lion_ops():
    from dsfast.ops import loaded_from
    cpu_op()
    if loaded_from("cpu_optim") == "reference":
        pytest.skip("the native cpu_optim op is not built here (reference fallback)")
    ps = [torch.randn(7), torch.randn(3, 2)]
    gs = [torch.randn(7), torch.randn(3, 2, dtype=torch.bfloat16)]
    outs = [torch.zeros(7, dtype=torch.float16), torch.zeros(6, dtype=torch.float16)]
    for with_outs in (outs, []):
        torch.library.opcheck(torch.ops.dsfast.cpu_adagrad_step.default,
                              (ps, gs, [torch.rand(7), torch.rand(3, 2)], with_outs,
                               [torch.tensor(0.0), torch.tensor(2.0)], 0.1, 1e-10, 0.01, 1.0, 1, "auto", "params"))
        torch.library.opcheck(torch.ops.dsfast.cpu_lion_step.default,
                              (ps, gs, [torch.randn(7), torch.randn(3, 2)], with_outs,
                               [torch.tensor(0.0), torch.tensor(2.0)], 0.1, 0.9, 0.99, 0.01, 1.0, 1, "auto",
                               "params"))


def test_deepspeed_import_paths_are_these_classes():
    from dsfast.ops.adagrad import DeepSpeedCPUAdagrad
    from dsfast.ops.lion import DeepSpeedCPULion
    assert DeepSpeedCPUAdagrad is O.CPUAdagrad and DeepSpeedCPULion is O.CPULion
    with pytest.raises(ImportError, match="FusedLion.*not implemented.*offload_optimizer"):
        from dsfast.ops.lion import FusedLion  # noqa: F401
    # DeepSpeed's positional order: (params, lr, eps, weight_decay, amsgrad, fp32_optimizer_states) and
    # (params, lr, betas, weight_decay, fp32_optimizer_states)
    a = DeepSpeedCPUAdagrad([_p()], 0.5, 1e-6, 0.1, False, False)
    assert a.defaults["lr"] == 0.5 and a.defaults["eps"] == 1e-6 and a.fp32_optimizer_states is False
    b = DeepSpeedCPULion([_p()], 0.5, (0.8, 0.9), 0.1, False)
    assert b.defaults["betas"] == (0.8, 0.9) and b.defaults["weight_decay"] == 0.1 and not b.fp32_optimizer_states
    assert O.CPULion([_p()]).defaults["betas"] == (0.9, 0.999)   # DeepSpeedCPULion's default


@pytest.mark.parametrize("cls", [O.CPUAdagrad, O.CPULion])
def test_stochastic_rounding_keeps_updates_below_half_a_bf16_ulp_on_average(cls):
    """A bf16 master at 1.0 stepped by at most 2^-12 per step (an eighth of half its ulp below 1.0) with gradient 1:
    nearest even never moves it; the stochastic option moves it by the summed updates on average (Lion: lr a step;
    Adagrad: lr / sqrt(k) at step k), and repeats itself."""
    steps, lr, n = 128, 2.0 ** -12, 4097
    want = 1 - (steps * lr if cls is O.CPULion else sum(lr / k ** 0.5 for k in range(1, steps + 1)))
    for isa in ISAS:
        finals = []
        for stochastic in (False, True, True):
            p = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16))
            opt = cls([p], lr=lr, isa=isa, stochastic_rounding=stochastic)
            for _ in range(steps):
                p.grad = torch.ones(n, dtype=torch.bfloat16)
                opt.step()
            finals.append(p.detach().float())
        assert torch.equal(finals[0], torch.ones(n)), f"{isa}: nearest even moved the parameter"
        assert abs(finals[1].mean().item() - want) < 0.1 * (1 - want), (isa, finals[1].mean().item(), want)
        assert torch.equal(finals[1], finals[2]), f"{isa}: the same run rounded differently"


@pytest.mark.parametrize("cls,kw", [(O.CPUAdagrad, dict(lr=0.05)), (O.CPULion, dict(lr=0.01))])
def test_step_runs_under_torch_compile(cls, kw):
    """torch.compile traces the ops through their schemas and fake implementations: the compiled step is the eager
    one, bit for bit. aot_eager traces as inductor does without generating C++ around the opaque ops (inductor itself
    runs once, on CPUAdam, in test_native_ops.py)."""
    from dsfast.ops import loaded_from
    cpu_op()
    if loaded_from("cpu_optim") == "reference":
        pytest.skip("the native cpu_optim op is not built here (reference fallback)")
    torch.manual_seed(0)
    model, ref = torch.nn.Linear(6, 4), torch.nn.Linear(6, 4)
    ref.load_state_dict(model.state_dict())
    initial = model.weight.detach().clone()
    opt, opt_ref = cls(model.parameters(), **kw), cls(ref.parameters(), **kw)
    step = torch.compile(opt.step, backend="aot_eager")
    x = torch.randn(8, 6)
    for _ in range(3):
        for m in (model, ref):
            m.zero_grad()
            m(x).pow(2).sum().backward()
        step()
        opt_ref.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(model.weight, initial)


# ---- the work-table fast path (as CPUAdam's: tests/test_cpu_optim_tables.py)
TABLE_SHAPES = [(37,), (5, 7), (1,), (300,)]
TABLE_CASES = [(O.CPUAdagrad, dict(lr=0.05, weight_decay=0.01), "adagrad"),
               (O.CPULion, dict(lr=1e-2, weight_decay=0.1, maximize=True), "lion")]


@pytest.fixture
def table_calls(monkeypatch):
    """Counts the table steps that ran and, under "<kind> stale", those refused because a tensor had moved."""
    from dsfast.ops import loaded_from
    native = cpu_op()
    if loaded_from("cpu_optim") == "reference":
        pytest.skip("the native cpu_optim op is not built here (reference fallback)")
    calls = {"adagrad": 0, "lion": 0, "adagrad stale": 0, "lion stale": 0}
    for kind in ("adagrad", "lion"):
        real = getattr(native, f"{kind}_table_step")

        def counted(*a, _real=real, _kind=kind, **k):
            ran = _real(*a, **k)
            calls[_kind if ran else f"{_kind} stale"] += 1
            return ran
        monkeypatch.setattr(native, f"{kind}_table_step", counted)
    return calls


def _table_run(cls, kw, tables, monkeypatch, halves=False, repoint=False, fresh_grads=False):
    from dsfast.optim import _cpu_op
    with monkeypatch.context() as m:
        if not tables:
            m.setattr(_cpu_op, "tables_usable", lambda: False)
        g = torch.Generator().manual_seed(0)
        ps = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in TABLE_SHAPES]
        opt = cls(ps, **kw)
        outs = [[torch.zeros(s, dtype=torch.bfloat16) for s in TABLE_SHAPES]] if halves else None
        old = None
        for k in range(4):
            for p in ps:   # refilled in place (DeepSpeed's buffers): the table is reused until a tensor moves
                fresh = torch.randn(p.shape, generator=g)
                p.grad = fresh if p.grad is None or fresh_grads else p.grad.copy_(fresh)
            if repoint and k == 3:   # p.data = ... (as ZeRO does) and a state re-pointed: the table is rebuilt
                old = ps[1].data, ps[1].data.clone()
                ps[1].data = ps[1].data.clone()
                st = opt.state[ps[3]][cls.STATE_KEY]
                st.data = st.data.clone()
            opt.step(fp16_param_groups=outs) if outs else opt.step()
        if old is not None:
            assert torch.equal(*old), "the old param memory was written"
        return ps, opt, outs


@pytest.mark.parametrize("halves", [False, True])
@pytest.mark.parametrize("repoint,fresh", [(False, False), (True, False), (False, True)],
                         ids=["same-grads", "repointed", "new-grads"])
@pytest.mark.parametrize("cls,kw,kind", TABLE_CASES)
def test_table_path_is_bit_identical_to_the_list_op(table_calls, monkeypatch, cls, kw, kind, halves, repoint, fresh):
    ref, ref_opt, ref_outs = _table_run(cls, kw, False, monkeypatch, halves, repoint, fresh)
    assert table_calls[kind] == 0
    got, opt, outs = _table_run(cls, kw, True, monkeypatch, halves, repoint, fresh)
    assert table_calls[kind] == 3                        # step 1 creates the state (list op), then the table
    assert table_calls[f"{kind} stale"] == int(repoint)  # the op saw the moved tensor itself
    for p, q in zip(got, ref):
        assert torch.equal(p, q)
        for key, t in opt.state[p].items():
            assert torch.equal(t, ref_opt.state[q][key]), key
    if halves:
        for a, b in zip(outs[0], ref_outs[0]):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_a_stale_one_state_table_writes_nothing_and_tables_pass_opcheck(table_calls):
    native = cpu_op()
    ps = [torch.randn(7), torch.randn(3, 2)]
    gs = [torch.randn(7), torch.randn(3, 2, dtype=torch.bfloat16)]
    states = [torch.rand(7), torch.rand(3, 2)]
    outs = [torch.zeros(7, dtype=torch.float16), torch.zeros(6, dtype=torch.float16)]
    steps = [torch.tensor(0.0), torch.tensor(2.0)]
    table, _ = native.one_state_table(ps, gs, states, outs, steps, "exp_avg_sq")
    assert native.adagrad_table_step(table, 0.1, 1e-10, 0.0) is True
    assert native.lion_table_step(table, 0.1, 0.9, 0.99, 0.0) is True
    assert [float(s) for s in steps] == [2.0, 4.0]
    ps[1].data = ps[1].data.clone()
    before = [t.clone() for t in ps + states + steps]
    assert native.lion_table_step(table, 0.1, 0.9, 0.99, 0.0) is False
    assert all(torch.equal(b, t) for b, t in zip(before, ps + states + steps)), "a stale table wrote"
    with pytest.raises(ValueError, match=r"params\[1\] state\['exp_avg'\] has 5 elements"):
        native.one_state_table(ps, gs, [states[0], torch.zeros(5)], outs, steps, "exp_avg")
    table, _ = native.one_state_table(ps, gs, states, outs, steps, "exp_avg")
    torch.library.opcheck(torch.ops.dsfast.cpu_one_state_table_fill_.default,
                          (torch.zeros(2, 15, dtype=torch.int64), ps, gs, states, outs, steps, "exp_avg", "params"))
    torch.library.opcheck(torch.ops.dsfast.cpu_adagrad_table_.default, (table, 0.1, 1e-10, 0.01, 0.5, 1, "auto"))
    torch.library.opcheck(torch.ops.dsfast.cpu_lion_table_.default, (table, 0.1, 0.9, 0.99, 0.01, 0.5, 1, "auto"))


def test_deepspeed_alias_imports_these_classes():
    """`import deepspeed` pointed at dsfast: deepspeed.ops.adagrad / .lion are dsfast's modules themselves."""
    import sys
    import dsfast
    before = set(sys.modules)
    saved = sys.modules.get("deepspeed")
    sys.modules["deepspeed"] = dsfast
    try:
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
        from deepspeed.ops.lion import DeepSpeedCPULion
        assert DeepSpeedCPUAdagrad is O.CPUAdagrad and DeepSpeedCPULion is O.CPULion
        assert sys.modules["deepspeed.ops.lion"] is sys.modules["dsfast.ops.lion"]
    finally:
        for name in set(sys.modules) - before:
            if name == "deepspeed" or name.startswith("deepspeed."):
                del sys.modules[name]
        if saved is None:
            sys.modules.pop("deepspeed", None)
        else:
            sys.modules["deepspeed"] = saved
