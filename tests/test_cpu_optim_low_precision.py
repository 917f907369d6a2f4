"""16-bit masters and optimizer states in the CPU optimizers (DeepSpeed's bf16_master_weights_and_grads,
bf16_optimizer_states / fp32_optimizer_states=False, fp16_master_weights_and_grads): the kernels read and write
the 16-bit tensors in place and compute in fp32, so after every step each stored value is the round-to-nearest-even
of the fp32 update of the stored inputs. The reference below does exactly that with torch ops."""
import math

import pytest
import torch

import dsfast.optim as O
from dsfast.optim.cpu_adam import adam_flat_step
from _cpu_optim_helpers import cpu_op, isas

SIZES = (1, 7, 17, 4097)
PAIRS = [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float16, torch.float16),
         (torch.float16, torch.float32)]


def ulps(dtype):
    """One unit in the last place, relative (vector bodies fuse multiply-adds: a result next to a rounding tie may
    land one ulp away), plus an absolute floor for moments that nearly cancel and fp16 subnormals."""
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-7)
    return dict(rtol=2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10, atol=1e-6)


def adam_reference(p, g, m, v, step, lr, betas, eps, wd):
    """One AdamW step from the stored values, in fp32, each result rounded to its tensor's dtype."""
    b1, b2 = betas
    p32, m32, v32, g32 = p.float(), m.float(), v.float(), g.float()
    p32 = p32 * (1 - lr * wd)
    m32 = m32 * b1 + g32 * (1 - b1)
    v32 = v32 * b2 + g32 * g32 * (1 - b2)
    denom = v32.sqrt() / math.sqrt(1 - b2 ** step) + eps
    p32 = p32 - lr / (1 - b1 ** step) * m32 / denom
    return p32.to(p.dtype), m32.to(m.dtype), v32.to(v.dtype)


@pytest.mark.parametrize("pdtype,sdtype", PAIRS)
@pytest.mark.parametrize("gdtype", [torch.float32, torch.bfloat16, torch.float16])
def test_adam_steps_16bit_masters_and_states_in_place(pdtype, sdtype, gdtype):
    torch.manual_seed(0)
    for isa in isas():
        params = [torch.nn.Parameter(torch.randn(n).to(pdtype)) for n in SIZES]
        opt = O.CPUAdam(params, lr=1e-2, weight_decay=0.05, fp32_optimizer_states=sdtype == torch.float32,
                        isa=isa)
        addresses = None
        for step in range(1, 4):
            # each step is checked from the values the kernel stored the step before (a one-ulp difference would
            # otherwise compound over the steps)
            before = [(p.detach().clone(), *(opt.state[p][k].clone() if opt.state[p] else
                                              torch.zeros_like(p, dtype=sdtype) for k in ("exp_avg", "exp_avg_sq")))
                      for p in params]
            grads = [torch.randn(n).to(gdtype) for n in SIZES]
            if gdtype == pdtype:   # .grad: the first step takes the list op, the later ones the work table
                for p, g in zip(params, grads):
                    p.grad = g
                opt.step()
            else:                  # torch refuses a .grad of another dtype: the amp contract's grads=
                opt.step(grads=[grads])
            if addresses is None:
                addresses = [(p.data_ptr(), opt.state[p]["exp_avg"].data_ptr()) for p in params]
            for i, (p, g) in enumerate(zip(params, grads)):
                want = adam_reference(*before[i][:1], g, *before[i][1:], step, 1e-2, (0.9, 0.999), 1e-8, 0.05)
                st = opt.state[p]
                got = (p.detach(), st["exp_avg"], st["exp_avg_sq"])
                assert [t.dtype for t in got] == [pdtype, sdtype, sdtype]
                what = f"isa={isa} step={step} n={SIZES[i]} param={pdtype} state={sdtype} grad={gdtype}"
                for name, a, b, dt in zip(("param", "exp_avg", "exp_avg_sq"), got, want, (pdtype, sdtype, sdtype)):
                    torch.testing.assert_close(a.float(), b.float(), **ulps(dt), msg=f"{what} {name}")
        # updated in place: no fp32 copy replaced the tensors
        assert addresses == [(p.data_ptr(), opt.state[p]["exp_avg"].data_ptr()) for p in params]


@pytest.mark.parametrize("pdtype,sdtype", PAIRS[:2])
def test_sgd_momentum_in_the_masters_dtype(pdtype, sdtype):
    torch.manual_seed(1)
    for isa in isas():
        p = torch.nn.Parameter(torch.randn(4097).to(pdtype))
        opt = O.CPUSGD([p], lr=0.05, momentum=0.9, weight_decay=0.01, fp32_optimizer_states=sdtype == torch.float32,
                       isa=isa)
        for step in range(3):   # each step from the values the kernel stored before (see the Adam test)
            before = p.detach().float().clone()
            buf = opt.state[p]["momentum_buffer"].float().clone() if step else None
            g = torch.randn(4097).to(pdtype)
            p.grad = g
            opt.step()
            d = g.float() + 0.01 * before
            buf = d if buf is None else buf * 0.9 + d    # the update reads the fp32 register, stored rounded
            assert opt.state[p]["momentum_buffer"].dtype == sdtype
            torch.testing.assert_close(opt.state[p]["momentum_buffer"].float(), buf.to(sdtype).float(),
                                       **ulps(sdtype))
            want = (before - 0.05 * buf).to(pdtype)
            torch.testing.assert_close(p.detach().float(), want.float(), **ulps(pdtype), msg=f"isa={isa} {step}")


def test_bf16_master_moves_away_from_fp32_by_rounding_only():
    """A bf16-master run tracks the fp32 one to bf16 rounding (the kernel is not silently computing in bf16)."""
    torch.manual_seed(2)
    w = torch.randn(10000)
    lo = torch.nn.Parameter(w.to(torch.bfloat16))
    hi = torch.nn.Parameter(w.to(torch.bfloat16).float())
    a = O.CPUAdam([lo], lr=1e-3, fp32_optimizer_states=False)
    b = O.CPUAdam([hi], lr=1e-3)
    for _ in range(5):
        g = torch.randn(10000)
        lo.grad, hi.grad = g.to(torch.bfloat16), g.to(torch.bfloat16).float()
        a.step()
        b.step()
    err = (lo.detach().float() - hi.detach()).abs().max().item()
    assert err <= 5 * 2 ** -8 * hi.detach().abs().max().item(), err


def test_state_dict_converts_states_explicitly_between_fp32_and_bf16():
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.randn(33).to(torch.bfloat16))
    opt = O.CPUAdam([p], lr=1e-2)             # bf16 master, fp32 states
    p.grad = torch.randn(33).to(torch.bfloat16)
    opt.step()
    m32 = opt.state[p]["exp_avg"].clone()
    assert m32.dtype == torch.float32
    sd = opt.state_dict()
    # into a bf16-state optimizer: rounded once, explicitly
    low = O.CPUAdam([p], lr=1e-2, fp32_optimizer_states=False)
    low.load_state_dict(sd)
    assert low.state[p]["exp_avg"].dtype == torch.bfloat16
    assert torch.equal(low.state[p]["exp_avg"], m32.to(torch.bfloat16))
    # back into fp32 states: torch alone would have rounded fp32 states to the bf16 param's dtype on load
    again = O.CPUAdam([p], lr=1e-2)
    again.load_state_dict(sd)
    assert again.state[p]["exp_avg"].dtype == torch.float32 and torch.equal(again.state[p]["exp_avg"], m32)
    again.load_state_dict(low.state_dict())
    assert torch.equal(again.state[p]["exp_avg"], m32.to(torch.bfloat16).float())
    p.grad = torch.randn(33).to(torch.bfloat16)
    again.step()   # the loaded states are the kernel's layout


def test_16bit_master_errors_name_the_tensor():
    n = 8
    p, g = torch.zeros(n, dtype=torch.bfloat16), torch.zeros(n)
    m, v = torch.zeros(n, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="own 16-bit copy"):
        adam_flat_step(p, g, m, v, 0, lr=1e-3, out16=torch.zeros(n, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"float32 or the parameter's dtype"):
        adam_flat_step(p, g, torch.zeros(n, dtype=torch.float16), torch.zeros(n, dtype=torch.float16), 0, lr=1e-3)
    with pytest.raises(TypeError, match="different dtypes"):
        adam_flat_step(p, g, m, torch.zeros(n), 0, lr=1e-3)
    with pytest.raises(TypeError, match="float32 or the parameter's dtype"):   # 16-bit states beside fp32
        adam_flat_step(torch.zeros(n), g, m, v, 0, lr=1e-3)
    assert not p.any() and not m.any(), "refused calls must not update"


def test_reference_op_matches_the_native_kernel_on_16bit_masters():
    from dsfast.ops.reference import cpu_optim as reference
    from dsfast.ops import loaded_from
    if loaded_from("cpu_optim") == "reference":
        pytest.skip("the native op is not built here")
    native = cpu_op()
    torch.manual_seed(4)
    p0, g = torch.randn(1000).to(torch.bfloat16), torch.randn(1000)
    runs = []
    for op in (native, reference):
        p, m, v, s = p0.clone(), torch.zeros(1000, dtype=torch.bfloat16), torch.zeros(1000, dtype=torch.bfloat16), \
            torch.tensor(0.0)
        for _ in range(3):
            op.adam_step([p], [g], [m], [v], [], [s], 1e-2, 0.9, 0.999, 1e-8, 0.01, True, True)
        runs.append((p, m, v))
    for a, b in zip(*runs):
        torch.testing.assert_close(a.float(), b.float(), **ulps(torch.bfloat16))


@pytest.mark.parametrize("cls", [O.CPUAdam, O.CPUSGD])
def test_stochastic_rounding_keeps_updates_below_half_a_bf16_ulp_on_average(cls):
    """A bf16 master at 1.0 stepped by 2^-12 (an eighth of half its ulp below 1.0): nearest even never moves it, the
    stochastic option moves it by the right amount on average; off by default, as in DeepSpeed."""
    steps, lr, n = 128, 2.0 ** -12, 4097
    kw = dict(momentum=0.0) if cls is O.CPUSGD else dict(betas=(0.0, 0.0))   # Adam's update: lr x sign(g)
    for isa in isas():
        finals = []
        for stochastic in (False, True, True):
            p = torch.nn.Parameter(torch.ones(n, dtype=torch.bfloat16))
            opt = cls([p], lr=lr, isa=isa, stochastic_rounding=stochastic, **kw)
            for _ in range(steps):
                p.grad = torch.ones(n, dtype=torch.bfloat16)
                opt.step()
            finals.append(p.detach().float())
        assert torch.equal(finals[0], torch.ones(n)), f"{isa}: nearest even moved the parameter"
        want = 1 - steps * lr
        assert abs(finals[1].mean().item() - want) < 0.1 * steps * lr, (isa, finals[1].mean().item(), want)
        assert torch.equal(finals[1], finals[2]), f"{isa}: the same run rounded differently"


def test_stochastic_rounding_is_the_same_in_the_reference_op():
    from dsfast.ops import loaded_from
    from dsfast.ops.reference import cpu_optim as reference
    if loaded_from("cpu_optim") == "reference":
        pytest.skip("the native op is not built here")
    native = cpu_op()
    torch.manual_seed(5)
    p0, g = torch.randn(4099).to(torch.bfloat16), torch.randn(4099)
    runs = []
    for op in (native, reference):
        p, m, v, s = p0.clone(), torch.zeros(4099), torch.zeros(4099), torch.tensor(0.0)
        op.adam_step([p], [g], [m], [v], [], [s], 1e-2, 0.9, 0.999, 1e-8, 0.0, True, True, round_seed=12345)
        runs.append(p.float())
    exact = (runs[0] == runs[1]).float().mean().item()
    assert exact > 0.99, exact     # the same random bits (an FMA may move a value across one threshold)
    torch.testing.assert_close(runs[0], runs[1], **ulps(torch.bfloat16))
