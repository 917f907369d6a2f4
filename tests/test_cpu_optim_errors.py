"""Every bad input to the CPU optimizers gets a ValueError/TypeError naming the parameter and
the value, before anything is updated."""
import pytest
import torch

import dsfast.optim as O
from dsfast.optim.cpu_adam import adam_flat_step
from dsfast.optim.cpu_sgd import sgd_flat_step
from _cpu_optim_helpers import cpu_op


def p_(n=8):
    return torch.zeros(n, requires_grad=True)


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(lr=-1.0), ValueError, ["lr", "-1.0"]),
    (dict(lr="fast"), TypeError, ["lr", "fast"]),
    (dict(betas=(1.0, 0.999)), ValueError, ["beta1", "1.0", "[0, 1)"]),
    (dict(betas=(0.9, -0.1)), ValueError, ["beta2", "-0.1"]),
    (dict(betas=(0.9,)), TypeError, ["betas"]),
    (dict(eps=0.0), ValueError, ["eps", "0.0"]),
    (dict(eps=float("nan")), ValueError, ["eps", "nan"]),
    (dict(weight_decay=-0.1), ValueError, ["weight_decay", "-0.1"]),
    (dict(amsgrad=True), ValueError, ["amsgrad"]),
    (dict(isa="sse9"), ValueError, ["isa", "sse9"]),
])
def test_adam_bad_hyperparameters(kwargs, exc, words):
    with pytest.raises(exc) as e:
        O.CPUAdam([p_()], **kwargs)
    for w in words:
        assert w in str(e.value), f"{w!r} missing from: {e.value}"


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(lr=-0.5), ValueError, ["lr", "-0.5"]),
    (dict(momentum=-0.9), ValueError, ["momentum", "-0.9"]),
    (dict(weight_decay=-1), ValueError, ["weight_decay", "-1"]),
    (dict(nesterov=True), ValueError, ["nesterov", "momentum"]),
    (dict(momentum=0.9, dampening=0.1, nesterov=True), ValueError, ["nesterov", "dampening"]),
])
def test_sgd_bad_hyperparameters(kwargs, exc, words):
    with pytest.raises(exc) as e:
        O.CPUSGD([p_()], **kwargs)
    for w in words:
        assert w in str(e.value)


def test_bad_hyperparameter_set_later_is_caught_at_step():
    p = p_()
    opt = O.CPUAdamW([p], lr=1e-3)
    opt.param_groups[0]["lr"] = -1e-3
    p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="lr"):
        opt.step()
    assert torch.equal(p.detach(), torch.zeros(8)), "a rejected step must not touch the parameter"


@pytest.mark.parametrize("cls", [O.CPUAdam, O.CPUSGD])
def test_non_contiguous_param_is_refused_not_copied(cls):
    good = p_()
    base = torch.zeros(4, 6)
    bad = base.t().requires_grad_()           # a non-contiguous leaf
    opt = cls([good, bad], lr=0.1)
    good.grad, bad.grad = torch.ones_like(good), torch.ones_like(bad)
    with pytest.raises(ValueError) as e:
        opt.step()
    assert "param_groups[0]['params'][1]" in str(e.value) and "contiguous" in str(e.value)
    assert torch.equal(good.detach(), torch.zeros(8)), "nothing may be updated when one tensor is refused"


@pytest.mark.parametrize("cls", [O.CPUAdam, O.CPUSGD])
def test_non_cpu_param_is_refused(cls):
    p = torch.zeros(8, device="meta", requires_grad=True)
    opt = cls([p], lr=0.1)
    p.grad = torch.zeros(8, device="meta")
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\].*meta"):
        opt.step()


@pytest.mark.parametrize("cls", [O.CPUAdam, O.CPUSGD])
def test_non_fp32_param_is_refused(cls):
    p = torch.zeros(8, dtype=torch.float64, requires_grad=True)
    opt = cls([p], lr=0.1)
    p.grad = torch.ones_like(p)
    with pytest.raises(TypeError, match="float64|Double"):
        opt.step()


def test_flat_entry_point_checks_grads_and_outputs():
    n = 10
    p, m, v = torch.zeros(n), torch.zeros(n), torch.zeros(n)
    with pytest.raises(ValueError, match="shape"):
        adam_flat_step(p, torch.zeros(n + 1), m, v, 0, lr=1e-3)
    with pytest.raises(TypeError, match="gradient dtypes"):
        adam_flat_step(p, torch.zeros(n, dtype=torch.int32), m, v, 0, lr=1e-3)
    with pytest.raises(ValueError, match="not contiguous"):
        adam_flat_step(p, torch.zeros(2 * n)[::2], m, v, 0, lr=1e-3)
    with pytest.raises(ValueError, match="exp_avg_sq"):
        adam_flat_step(p, torch.zeros(n), m, torch.zeros(n - 1), 0, lr=1e-3)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        adam_flat_step(p, torch.zeros(n), m, v, 0, lr=1e-3, out16=torch.zeros(n))
    with pytest.raises(ValueError, match="16-bit output"):
        adam_flat_step(p, torch.zeros(n), m, v, 0, lr=1e-3, out16=torch.zeros(n + 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="momentum_buffer"):
        sgd_flat_step(p, torch.zeros(n), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="eps"):
        adam_flat_step(p, torch.zeros(n), m, v, 0, lr=1e-3, eps=-1.0)
    assert torch.equal(p, torch.zeros(n)) and torch.equal(m, torch.zeros(n)), "refused calls must not update"


def test_fp16_param_groups_checked():
    p = p_()
    opt = O.CPUAdam([p])
    p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="fp16_param_groups"):
        opt.step(fp16_param_groups=[[torch.zeros(8, dtype=torch.bfloat16)] * 2])
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        opt.step(fp16_param_groups=[[torch.zeros(8)]])


def test_forcing_an_isa_the_cpu_lacks_is_refused():
    op = cpu_op()
    missing = [i for i in ("avx512", "avx2") if i not in op.available_isas()]
    if not missing:
        pytest.skip("this CPU runs every ISA body")
    with pytest.raises(ValueError, match=missing[0]):
        O.CPUAdam([p_()], isa=missing[0])


def test_refused_sgd_step_leaves_no_unseeded_momentum_buffer():
    good, bad = p_(), torch.zeros(4, 6).t().requires_grad_()
    opt = O.CPUSGD([good, bad], lr=0.1, momentum=0.9, dampening=0.5)
    good.grad, bad.grad = torch.ones_like(good), torch.ones_like(bad)
    with pytest.raises(ValueError):
        opt.step()
    assert "momentum_buffer" not in opt.state[good]
    opt.param_groups[0]["params"] = [good]
    opt.step()                                   # first real step seeds the buffer with the grad
    assert torch.equal(opt.state[good]["momentum_buffer"], torch.ones(8))


def test_op_rejects_non_tensor_lists_and_accepts_per_tensor_none_outputs():
    op = cpu_op()
    z = torch.zeros(4)
    args = (1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    with pytest.raises(TypeError, match=r"params\[0\]"):
        op.adam_step([1], [z], [z], [z], [], [torch.tensor(0.0)], *args)
    with pytest.raises(TypeError, match="params must be a list or tuple"):
        op.adam_step(5, [z], [z], [z], [], [torch.tensor(0.0)], *args)
    with pytest.raises(ValueError, match="outs has 1 entries"):
        op.adam_step([z, z.clone()], [z, z], [z.clone(), z.clone()], [z.clone(), z.clone()], [None],
                     [torch.tensor(0.0), torch.tensor(0.0)], *args)
    ps = [torch.ones(4), torch.ones(4)]
    out = torch.zeros(4, dtype=torch.bfloat16)
    op.adam_step(ps, [z, z], [torch.zeros(4), torch.zeros(4)], [torch.zeros(4), torch.zeros(4)], [None, out],
                 [torch.tensor(0.0), torch.tensor(0.0)], *args)
    assert torch.equal(out, ps[1].to(torch.bfloat16))


def test_native_op_names_the_argument_it_cannot_convert():
    from dsfast.ops import loaded_from
    op, z = cpu_op(), torch.zeros(4)
    if loaded_from("cpu_optim") == "reference":
        pytest.skip("the native op's own argument parsing is not loaded (reference fallback)")
    lists = ([z.clone()], [z], [z.clone()], [z.clone()], [], [torch.tensor(0.0)])
    ok = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, adamw=True, bias_correction=True)
    with pytest.raises(TypeError, match="argument 'lr' but instead found type 'str'"):
        op.adam_step(*lists, **{**ok, "lr": "x"})
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        op.adam_step(*lists, **ok, bogus=1)
    with pytest.raises(TypeError, match="missing .*required .*'lr'"):
        op.adam_step(*lists)
    p = lists[0][0]
    op.adam_step(*lists, **ok, label="L", isa="scalar")      # a keyword call with every option works
    assert torch.equal(p, torch.zeros(4))                      # zero grad, zero state: p stays 0


@pytest.mark.parametrize("cls", ["CPUAdam", "CPUSGD", "CPUAdagrad", "CPULion", "CPUAdam8bit"])
def test_a_sparse_gradient_is_refused_by_name(cls):
    import dsfast.optim as O
    emb = torch.nn.Embedding(10, 4, sparse=True)
    dense = torch.nn.Linear(4, 2)
    opt = getattr(O, cls)([{"params": dense.parameters()}, {"params": emb.parameters()}], lr=1e-2)
    dense(emb(torch.tensor([1, 2]))).sum().backward()
    before = emb.weight.detach().clone()
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\] has a sparse gradient; "
                                         f"{cls} updates dense gradients"):
        opt.step()
    assert torch.equal(emb.weight, before)
