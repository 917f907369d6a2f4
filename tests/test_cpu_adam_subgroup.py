"""CPUAdam.step_subgroup / rollback_subgroup (DeepSpeedCPUAdam's per-subgroup step and its undo, DeepSpeed 0.19.8).

step_subgroup is the SIMD kernel's update: bit-identical to step() on the same values, and within 2e-6 (absolute,
unit-scale values) of torch.optim.Adam/AdamW for fp32. rollback_subgroup inverts one step algebraically in float64:
the parameter comes back to within a few fp32 ulps (atol 2e-6 on values of size ~4; one 16-bit rounding, atol 2 ulps
of 4 in the parameter's dtype, for bf16 / fp16 parameters), exp_avg within 1e-6 of its scale, exp_avg_sq within 1e-6 of
the stepped exp_avg_sq's scale (the inversion subtracts (1 - beta2) * g * g from it), and the states are exactly
zero again when the step count returns to 0.
"""
import pytest
import torch

from dsfast.ops.adam import DeepSpeedCPUAdam
from dsfast.optim import CPUAdam

N = 257   # not a multiple of any vector width: the kernel's tail runs too

CONFIGS = [dict(adamw_mode=True, weight_decay=0.0), dict(adamw_mode=True, weight_decay=0.05),
           dict(adamw_mode=False, weight_decay=0.05), dict(adamw_mode=True, weight_decay=0.0, bias_correction=False),
           dict(adamw_mode=True, weight_decay=0.01, maximize=True)]


def _torch_reference(p0, grads, lr, adamw_mode, weight_decay, maximize=False, bias_correction=True):
    assert bias_correction
    ref = torch.nn.Parameter(p0.clone())
    cls = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    opt = cls([ref], lr=lr, weight_decay=weight_decay, maximize=maximize)
    for g in grads:
        ref.grad = g.clone()
        opt.step()
    return ref.detach(), opt.state[ref]


@pytest.mark.parametrize("cfg", CONFIGS[:3] + CONFIGS[4:], ids=["adamw", "adamw_wd", "adam_l2", "maximize"])
def test_step_subgroup_matches_torch_and_step(cfg):
    torch.manual_seed(1)
    p0 = torch.randn(N)
    grads = [torch.randn(N) for _ in range(5)]
    p = torch.nn.Parameter(p0.clone())
    q = torch.nn.Parameter(p0.clone())
    a = DeepSpeedCPUAdam([p], lr=1e-2, **cfg)
    b = DeepSpeedCPUAdam([q], lr=1e-2, **cfg)
    for k, g in enumerate(grads, 1):
        p.grad, q.grad = g.clone(), g.clone()
        a.step_subgroup(3)
        b.step()
        assert a.state[3]["step"] == k and isinstance(a.state[3]["step"], int)
        assert torch.equal(p, q)   # the same kernel: bit-identical
        assert torch.equal(a.state[3]["exp_avg"], b.state[q]["exp_avg"])
        assert torch.equal(a.state[3]["exp_avg_sq"], b.state[q]["exp_avg_sq"])
    assert p not in a.state   # the state lives under the subgroup id only
    ref, ref_state = _torch_reference(p0, grads, 1e-2, **cfg)
    torch.testing.assert_close(p.detach(), ref, rtol=0, atol=2e-6)
    torch.testing.assert_close(a.state[3]["exp_avg"], ref_state["exp_avg"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(a.state[3]["exp_avg_sq"], ref_state["exp_avg_sq"], rtol=1e-5, atol=1e-8)


def test_subgroup_state_follows_the_id_not_the_tensor():
    """ZeRO-3 swaps each subgroup's partition into param_groups: the state is the id's."""
    torch.manual_seed(2)
    x, y = torch.nn.Parameter(torch.randn(N)), torch.nn.Parameter(torch.randn(64))
    opt = DeepSpeedCPUAdam([x])
    for _ in range(2):
        opt.param_groups[0]["params"] = [x]
        x.grad = torch.randn(N)
        opt.step_subgroup(0)
        opt.param_groups[0]["params"] = [y]
        y.grad = torch.randn(64)
        opt.step_subgroup(1)
    assert opt.state[0]["step"] == 2 and opt.state[1]["step"] == 2
    assert opt.state[0]["exp_avg"].shape == (N,) and opt.state[1]["exp_avg"].shape == (64,)


@pytest.mark.parametrize("cfg", CONFIGS, ids=["adamw", "adamw_wd", "adam_l2", "no_bias_corr", "maximize"])
@pytest.mark.parametrize("steps", [1, 2, 5])
def test_rollback_inverts_one_step(cfg, steps):
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p], lr=1e-2, **cfg)
    before = None
    for k in range(steps):
        p.grad = torch.randn(N)
        if k == steps - 1:
            before = (p.detach().clone(), {key: (v.clone() if torch.is_tensor(v) else v)
                                           for key, v in opt.state[0].items()})
        opt.step_subgroup(0)
    v_scale = opt.state[0]["exp_avg_sq"].abs().max().item()
    opt.rollback_subgroup(0)
    p_before, s_before = before
    assert opt.state[0]["step"] == steps - 1
    torch.testing.assert_close(p.detach(), p_before, rtol=0, atol=2e-6)
    if steps == 1:   # back to the state's creation: exactly
        assert not opt.state[0]["exp_avg"].any() and not opt.state[0]["exp_avg_sq"].any()
    else:
        m_scale = s_before["exp_avg"].abs().max().item()
        torch.testing.assert_close(opt.state[0]["exp_avg"], s_before["exp_avg"], rtol=0, atol=1e-6 * m_scale)
        torch.testing.assert_close(opt.state[0]["exp_avg_sq"], s_before["exp_avg_sq"], rtol=0, atol=1e-6 * v_scale)
        assert (opt.state[0]["exp_avg_sq"] >= 0).all()
    # stepping again with the same gradient lands where the step had
    p2 = p.detach().clone()
    opt.step_subgroup(0)
    opt.rollback_subgroup(0)
    torch.testing.assert_close(p.detach(), p2, rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("fp32_states", [True, False], ids=["fp32_states", "own_states"])
def test_rollback_16bit_parameter(dtype, fp32_states):
    torch.manual_seed(4)
    p = torch.nn.Parameter(torch.randn(N).to(dtype))
    opt = DeepSpeedCPUAdam([p], lr=1e-2, fp32_optimizer_states=fp32_states)
    for _ in range(2):
        p.grad = torch.randn(N).to(dtype)
        opt.step_subgroup(0)
    assert opt.state[0]["exp_avg"].dtype == (torch.float32 if fp32_states else dtype)
    p_before = p.detach().clone()
    m_before = opt.state[0]["exp_avg"].clone()
    p.grad = torch.randn(N).to(dtype)
    opt.step_subgroup(0)
    opt.rollback_subgroup(0)
    ulp = 4 * torch.finfo(dtype).eps   # one ulp of values up to 4
    torch.testing.assert_close(p.detach().float(), p_before.float(), rtol=0, atol=2 * ulp)
    m_atol = 1e-6 if fp32_states else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(opt.state[0]["exp_avg"].float(), m_before.float(), rtol=0, atol=m_atol)
    assert opt.state[0]["step"] == 2


def test_rollback_to_zero_then_step_again_is_a_first_step():
    torch.manual_seed(5)
    p = torch.nn.Parameter(torch.randn(N))
    p0 = p.detach().clone()
    opt = DeepSpeedCPUAdam([p], lr=1e-2)
    p.grad = torch.randn(N)
    for _ in range(3):
        opt.step_subgroup(0)
    for _ in range(3):
        opt.rollback_subgroup(0)
    assert opt.state[0]["step"] == 0
    torch.testing.assert_close(p.detach(), p0, rtol=0, atol=1e-5)
    assert not opt.state[0]["exp_avg"].any()
    q = torch.nn.Parameter(p.detach().clone())
    ref = DeepSpeedCPUAdam([q], lr=1e-2)
    q.grad = p.grad.clone()
    ref.step()
    opt.step_subgroup(0)
    assert torch.equal(p, q)


def test_no_gradient_step_is_a_no_op():
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p])
    before = p.detach().clone()
    opt.step_subgroup(0)
    assert torch.equal(p, before)
    assert 0 not in opt.state


def test_closure_is_run():
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p])
    p.grad = torch.randn(N)
    assert opt.step_subgroup(0, closure=lambda: 1.5) == 1.5
    assert opt.rollback_subgroup(0, closure=lambda: 2.5) == 2.5


# -- errors --

def test_rollback_uninitialized_subgroup():
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p])
    p.grad = torch.randn(N)
    with pytest.raises(RuntimeError, match="Cannot rollback optimizer state for sub_group_id 0 as it has not been "
                                           "initialized"):
        opt.rollback_subgroup(0)
    opt.step_subgroup(0)
    with pytest.raises(RuntimeError, match="sub_group_id 7 as it has not been initialized"):
        opt.rollback_subgroup(7)
    assert 7 not in opt.state   # the check made no entry


def test_rollback_at_step_zero():
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p])
    p.grad = torch.randn(N)
    opt.step_subgroup(0)
    opt.rollback_subgroup(0)
    with pytest.raises(RuntimeError, match="Cannot rollback sub_group_id 0: step count is 0"):
        opt.rollback_subgroup(0)


def test_rollback_without_gradient():
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p])
    p.grad = torch.randn(N)
    opt.step_subgroup(0)
    p.grad = None
    with pytest.raises(RuntimeError, match="no parameter has a gradient"):
        opt.rollback_subgroup(0)
    assert opt.state[0]["step"] == 1


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), (1.0, TypeError), ("0", TypeError), (True, TypeError),
                                      (torch.tensor(0), TypeError), (None, TypeError)])
def test_bad_subgroup_id(bad, exc):
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p])
    p.grad = torch.randn(N)
    with pytest.raises(exc, match="subgroup_id"):
        opt.step_subgroup(bad)
    with pytest.raises(exc, match="subgroup_id"):
        opt.rollback_subgroup(bad)


def test_numpy_integer_id_is_an_int():
    np = pytest.importorskip("numpy")
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p])
    p.grad = torch.randn(N)
    opt.step_subgroup(np.int64(2))
    assert opt.state[2]["step"] == 1
    opt.rollback_subgroup(np.int64(2))
    assert opt.state[2]["step"] == 0


def test_more_than_one_parameter_with_a_gradient():
    a, b = torch.nn.Parameter(torch.randn(N)), torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([{"params": [a]}, {"params": [b]}])
    a.grad, b.grad = torch.randn(N), torch.randn(N)
    with pytest.raises(ValueError, match="2 parameters have a gradient"):
        opt.step_subgroup(0)
    b.grad = None
    opt.step_subgroup(0)
    b.grad = torch.randn(N)
    with pytest.raises(ValueError, match="2 parameters have a gradient"):
        opt.rollback_subgroup(0)


def test_size_mismatch():
    a, b = torch.nn.Parameter(torch.randn(N)), torch.nn.Parameter(torch.randn(N + 1))
    opt = DeepSpeedCPUAdam([a])
    a.grad = torch.randn(N)
    opt.step_subgroup(0)
    opt.param_groups[0]["params"] = [b]
    b.grad = torch.randn(N + 1)
    with pytest.raises(ValueError, match="has 257 elements but the parameter with a gradient has 258"):
        opt.step_subgroup(0)
    with pytest.raises(ValueError, match="has 257 elements"):
        opt.rollback_subgroup(0)


def test_foreign_state_under_the_id():
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p])
    p.grad = torch.randn(N)
    opt.state[0] = {"momentum_buffer": torch.zeros(N)}
    with pytest.raises(ValueError, match="not a subgroup's state"):
        opt.step_subgroup(0)


def test_non_cpu_parameter():
    p = torch.nn.Parameter(torch.randn(N, device="meta"))
    opt = DeepSpeedCPUAdam([p])
    p.grad = torch.randn(N, device="meta")
    with pytest.raises(ValueError, match="CPUAdam steps CPU tensors"):
        opt.step_subgroup(0)


@pytest.mark.parametrize("betas", [(0.0, 0.999), (0.9, 0.0)])
def test_rollback_beta_zero_past_first_step(betas):
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p], betas=betas)
    p.grad = torch.randn(N)
    opt.step_subgroup(0)
    opt.step_subgroup(0)
    with pytest.raises(ValueError, match="not recoverable"):
        opt.rollback_subgroup(0)
    assert opt.state[0]["step"] == 2
    # the first step is invertible whatever the betas: the states it started from are zeros
    q = torch.nn.Parameter(torch.randn(N))
    q0 = q.detach().clone()
    opt2 = DeepSpeedCPUAdam([q], betas=betas)
    q.grad = torch.randn(N)
    opt2.step_subgroup(0)
    opt2.rollback_subgroup(0)
    torch.testing.assert_close(q.detach(), q0, rtol=0, atol=2e-6)


def test_rollback_adamw_total_decay():
    p = torch.nn.Parameter(torch.randn(N))
    opt = DeepSpeedCPUAdam([p], lr=0.5, weight_decay=2.0)
    p.grad = torch.randn(N)
    opt.step_subgroup(0)
    with pytest.raises(ValueError, match="lr \\* weight_decay == 1"):
        opt.rollback_subgroup(0)


def test_cpuadam_class_has_them():
    assert DeepSpeedCPUAdam is CPUAdam
    assert callable(CPUAdam.step_subgroup) and callable(CPUAdam.rollback_subgroup)
