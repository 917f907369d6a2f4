"""dsfast.ops.multi_tensor (loss-scale unscale + overflow flag, L2 norms, clip coefficient) and
the cuda_optim reference's argument checks, on CPU tensors, against torch's own functions."""
import pytest
import torch

from dsfast.ops import multi_tensor as mt
from dsfast.ops.reference import portable_multi_tensor as ref
from dsfast.optim import FusedAdam

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def tensors(seed=0, sizes=(1, 7, 17, 4097), dtypes=DTYPES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g).to(dtypes[i % len(dtypes)]) for i, n in enumerate(sizes)]


def test_unscale_and_check_matches_torch_and_only_raises_the_flag():
    ours, theirs = tensors(), tensors()
    inv = torch.tensor(0.125)
    flag, tflag = torch.zeros(()), torch.zeros(())
    mt.unscale_and_check_(ours, inv, flag)
    for t in theirs:  # torch's kernel wants one dtype per call
        torch._amp_foreach_non_finite_check_and_unscale_([t], tflag, inv)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)
    assert float(flag) == 0.0
    for bad in (float("inf"), float("nan")):
        ts = tensors(1)
        ts[2][3] = bad
        flag = torch.zeros(())
        mt.unscale_and_check_(ts, inv, flag)
        assert float(flag) == 1.0
        mt.unscale_and_check_(tensors(2), inv, flag)  # a clean call never clears it
        assert float(flag) == 1.0


def test_l2_norm_total_and_per_tensor_match_torch():
    ts = tensors(3)
    total, per = mt.l2_norm(ts, per_tensor=True)
    expect = torch.cat([t.float() for t in ts]).norm()
    torch.testing.assert_close(total, expect, rtol=1e-6, atol=0)
    torch.testing.assert_close(per, torch.stack([t.float().norm() for t in ts]), rtol=1e-6, atol=0)
    assert total.dtype == torch.float32 and total.dim() == 0
    total2, none = mt.l2_norm(ts[:1])
    assert none is None
    torch.testing.assert_close(total2, ts[0].float().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clip_matches_clip_grad_norm(dtype):
    ours, theirs = tensors(4, dtypes=(dtype,)), tensors(4, dtypes=(dtype,))
    params = [torch.nn.Parameter(torch.zeros_like(t)) for t in theirs]
    for p, t in zip(params, theirs):
        p.grad = t
    expect = torch.nn.utils.clip_grad_norm_(params, max_norm=0.5)
    total = mt.clip_grads_(ours, max_norm=0.5)
    tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(total, expect.float(), **tol)  # torch rounds a bf16 norm to bf16
    fresh = tensors(4, dtypes=(dtype,))  # ours accumulates in fp32 whatever the dtype
    torch.testing.assert_close(total, torch.cat([t.float() for t in fresh]).norm(), rtol=1e-5, atol=0)
    for a, p in zip(ours, params):
        torch.testing.assert_close(a, p.grad, **tol)
    # max_norm above the norm: coefficient 1, nothing changes
    big = tensors(5)
    _, coef = mt.grad_norm_and_clip_coef(big, max_norm=1e6)
    assert float(coef) == 1.0


def test_norm_with_inv_scale_flags_overflow_and_gives_the_unscaled_clip_coef():
    ts = tensors(6, dtypes=(torch.float32,))
    scaled = [t * 1024.0 for t in ts]
    flag = torch.zeros(())
    total, coef = mt.grad_norm_and_clip_coef(scaled, 1.0, inv_scale=torch.tensor(1 / 1024), found_inf=flag)
    true_norm = torch.cat(ts).norm()
    torch.testing.assert_close(total, true_norm, rtol=1e-5, atol=0)
    torch.testing.assert_close(coef, torch.clamp(1.0 / (true_norm + 1e-6), max=1.0), rtol=1e-5, atol=0)
    assert float(flag) == 0.0
    scaled[1][0] = float("inf")
    mt.grad_norm_and_clip_coef(scaled, 1.0, inv_scale=torch.tensor(1 / 1024), found_inf=flag)
    assert float(flag) == 1.0
    # mixed dtypes take the grouped path and give the same answer
    mixed = tensors(7)
    t_all, _ = mt.l2_norm(mixed)
    torch.testing.assert_close(t_all, torch.cat([t.float() for t in mixed]).norm(), rtol=1e-6, atol=0)


def test_fused_mixed_precision_step_equals_torch_unscale_clip_adamw():
    """The engine's flow: one norm pass over scaled grads, then FusedAdam unscales, clips and
    skips in its own pass. Reference: unscale, clip_grad_norm_, AdamW."""
    base = tensors(8, dtypes=(torch.float32,))
    ours = [torch.nn.Parameter(t.clone()) for t in base]
    theirs = [torch.nn.Parameter(t.clone()) for t in base]
    opt, topt = FusedAdam(ours, lr=1e-2, weight_decay=0.01), torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.01)
    scale = 4096.0
    for s in range(3):
        grads = tensors(20 + s, dtypes=(torch.float32,))
        for p, q, g in zip(ours, theirs, grads):
            p.grad = g * scale
            q.grad = g.clone()
        inv = torch.tensor(1 / scale)
        flag = torch.zeros(())
        _, coef = mt.grad_norm_and_clip_coef([p.grad for p in ours], 0.3, inv_scale=inv, found_inf=flag)
        opt.step(grad_scale=torch.tensor(scale), found_inf=flag, clip_coef=coef)
        torch.nn.utils.clip_grad_norm_(theirs, 0.3)
        topt.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


def test_reference_optimizer_functions_with_mixed_grad_dtypes_and_model_copies():
    p = torch.randn(33)
    master = p.clone()
    g16 = torch.randn(33).to(torch.bfloat16)
    m, v = torch.zeros(33), torch.zeros(33)
    model = torch.empty(33, dtype=torch.bfloat16)
    step = torch.ones(())
    ref.adam_([g16], [master], [m], [v], [step], [model], 1e-2, 0.9, 0.999, 1e-8, 0.0, True, True)
    q = torch.nn.Parameter(p.clone())
    q.grad = g16.float()
    torch.optim.AdamW([q], lr=1e-2, weight_decay=0.0).step()
    torch.testing.assert_close(master, q.detach(), rtol=1e-5, atol=1e-6)
    assert torch.equal(model, master.to(torch.bfloat16))


def test_argument_errors():
    ts = tensors(9)
    with pytest.raises(TypeError, match="list of tensors"):
        mt.l2_norm(ts[0])
    with pytest.raises(TypeError, match=r"tensors\[1\] must be a torch.Tensor"):
        mt.l2_norm([ts[0], 3.0])
    with pytest.raises(ValueError, match="at least one tensor"):
        mt.l2_norm([])
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        mt.grad_norm_and_clip_coef(ts, 0.0)
    with pytest.raises(TypeError, match="inv_scale must be float32"):
        mt.unscale_and_check_(ts, torch.tensor(1.0, dtype=torch.float64), torch.zeros(()))
    ps = [torch.zeros(3), torch.zeros(4)]
    with pytest.raises(RuntimeError, match="got 1 grads for 2 params"):
        ref.adam_([torch.zeros(3)], ps, ps, ps, [torch.ones(())] * 2, [], 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    with pytest.raises(RuntimeError, match=r"grads\[1\] has 5 elements but its parameter has 4"):
        ref.sgd_([torch.zeros(3), torch.zeros(5)], ps, [], [], 0.1, 0.0, 0.0, 0.0, False, False)
    with pytest.raises(RuntimeError, match=r"grads\[0\] is not contiguous"):
        ref.sgd_([torch.zeros(2, 2).t()], [torch.zeros(2, 2)], [], [], 0.1, 0.0, 0.0, 0.0, False, False)
    with pytest.raises(TypeError, match=r"grads\[0\] has dtype torch.float64"):
        ref.sgd_([torch.zeros(3, dtype=torch.float64)], ps[:1], [], [], 0.1, 0.0, 0.0, 0.0, False, False)
    with pytest.raises(TypeError, match="master weights"):
        ref.sgd_([torch.zeros(3)], [torch.zeros(3, dtype=torch.bfloat16)], [], [torch.zeros(3, dtype=torch.bfloat16)],
                 0.1, 0.0, 0.0, 0.0, False, False)
