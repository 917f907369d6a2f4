"""The native cuda_optim kernels on a GPU against the pure-torch reference (same inputs, every
dtype combination, sizes hitting every vector tail and chunk edge, misaligned views, thousands
of tensors, one tensor over 2^31 elements) and against torch (AdamW fused, SGD,
clip_grad_norm_, the amp unscale). Skipped without a GPU (tests/conftest.py).

Tolerances: fp32 results rtol 1e-5 / atol 1e-6 (nvcc may contract a*b+c into an FMA where
torch rounds twice); 16-bit outputs one unit in the last place of their dtype."""
import os

import pytest
import torch

from dsfast.ops.reference import portable_multi_tensor as ref

pytestmark = pytest.mark.gpu

# DSFAST_TEST_DEVICE=cpu (with pytest --noconftest) dry-runs this file's own logic on the CPU,
# with the reference standing in for the op; the real run is on "cuda".
DEV = os.environ.get("DSFAST_TEST_DEVICE", "cuda")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# 1..17: scalar tails of every vector width; 4097: a ragged block; 65536 +- 3: chunk edges.
SIZES = (1, 3, 7, 8, 9, 17, 4097, 65533, 65536, 65539, (1 << 20) + 3)


@pytest.fixture(scope="module")
def op():
    if DEV == "cpu":
        return ref
    import dsfast.ops as ops
    os.environ.setdefault("DSFAST_REQUIRE_OPS", "1")
    mod = ops.load("cuda_optim")
    assert ops.loaded_from("cuda_optim") in ("jit", "prebuilt"), "the native op did not load"
    return mod


# Every tensor a kernel is given sits between GUARD sentinel elements on each side; the autouse
# fixture `guards` checks after each test that no kernel wrote outside its tensor.
GUARD = 16
SENTINEL = -1234.5
_guarded = []


def guarded(values, misalign=False):
    """A copy of `values` inside a larger allocation, between sentinels. misalign puts it one element
    off the 16-byte alignment (the scalar path); otherwise 16-byte alignment, which the vector path
    needs, is asserted."""
    n, off = values.numel(), GUARD + (1 if misalign else 0)
    buf = torch.full((off + n + GUARD,), SENTINEL, dtype=values.dtype, device=values.device)
    t = buf[off:off + n]
    t.copy_(values.reshape(-1))
    if not misalign:
        assert t.data_ptr() % 16 == 0, "an aligned tensor must be 16-byte aligned (the vector path)"
    _guarded.append((buf, off, n))
    return t


@pytest.fixture(autouse=True)
def guards():
    _guarded.clear()
    yield
    for buf, off, n in _guarded:
        s = torch.tensor(SENTINEL, dtype=buf.dtype, device=buf.device)
        assert torch.equal(buf[:off], s.expand(off)), f"a kernel wrote before a tensor of {n} elements"
        assert torch.equal(buf[off + n:], s.expand(GUARD)), f"a kernel wrote past the end of a tensor of {n} elements"
    _guarded.clear()


def rand(n, dtype, seed, misalign=False):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return guarded(torch.randn(n, generator=g, device=DEV).to(dtype), misalign)


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else \
        dict(rtol=2e-3, atol=1e-5) if dtype == torch.float16 else dict(rtol=1.6e-2, atol=1e-5)


def adam_inputs(sizes, gdt, pdt, master, seed=0, misalign_every=4):
    state_dt = torch.float32 if master else pdt
    lists = {k: [] for k in ("g", "p", "m", "v", "s", "c")}
    for i, n in enumerate(sizes):
        mis = misalign_every and i % misalign_every == 1
        lists["g"].append(rand(n, gdt, seed + 10 * i, mis))
        lists["p"].append(rand(n, torch.float32 if master else pdt, seed + 10 * i + 1, mis))
        lists["m"].append(guarded(rand(n, state_dt, seed + 10 * i + 2, mis) * 0.1, mis))
        lists["v"].append(guarded(rand(n, state_dt, seed + 10 * i + 3, mis).abs() * 0.01, mis))
        lists["s"].append(torch.tensor(float(i % 5 + 1), device=DEV))
        if master:
            lists["c"].append(guarded(torch.zeros(n, dtype=pdt, device=DEV), mis))
    return lists


def clone_lists(lists):
    return {k: [t.clone() for t in v] for k, v in lists.items()}


def run_adam(mod, L, **kw):
    args = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.02, adamw=True, bias_correction=True)
    args.update(kw)
    mod.adam_(L["g"], L["p"], L["m"], L["v"], L["s"], L["c"], args.pop("lr"), args.pop("beta1"), args.pop("beta2"),
              args.pop("eps"), args.pop("weight_decay"), args.pop("adamw"), args.pop("bias_correction"), **args)


def compare(a, b, dtype):
    for x, y in zip(a, b):
        torch.testing.assert_close(x.float(), y.float(), **tol(dtype))


combos = [(g, p, None) for g in DTYPES for p in DTYPES] + \
         [(g, torch.float32, c) for g in DTYPES for c in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("gdt,pdt,copy", combos, ids=lambda x: str(x).replace("torch.", ""))
@pytest.mark.parametrize("adamw", [True, False])
def test_adam_every_dtype_combination_matches_reference(op, gdt, pdt, copy, adamw):
    L = adam_inputs(SIZES, gdt, copy or pdt, master=copy is not None)
    R = clone_lists(L)
    run_adam(op, L, adamw=adamw)
    run_adam(ref, R, adamw=adamw)
    compare(L["p"], R["p"], pdt)
    compare(L["m"], R["m"], pdt)
    compare(L["v"], R["v"], pdt)
    if copy is not None:
        for c, p in zip(L["c"], L["p"]):
            assert torch.equal(c, p.to(copy)), "model copy must be the rounded master"


@pytest.mark.parametrize("gdt,pdt,copy", combos, ids=lambda x: str(x).replace("torch.", ""))
def test_sgd_every_dtype_combination_matches_reference(op, gdt, pdt, copy):
    for momentum, damp, nesterov, first in ((0.0, 0.0, False, False), (0.9, 0.0, True, False),
                                            (0.8, 0.25, False, True), (0.8, 0.25, False, False)):
        L = adam_inputs(SIZES, gdt, copy or pdt, master=copy is not None, seed=7)
        bufs = L["m"] if momentum else []
        R = clone_lists(L)
        rbufs = R["m"] if momentum else []
        for mod, X, b in ((op, L, bufs), (ref, R, rbufs)):
            mod.sgd_(X["g"], X["p"], b, X["c"], 0.05, momentum, damp, 0.01, nesterov, first,
                     inv_scale=torch.tensor(0.5, device=DEV))
        compare(L["p"], R["p"], pdt)
        if momentum:
            compare(L["m"], R["m"], pdt)
        if copy is not None:
            for c, p in zip(L["c"], L["p"]):
                assert torch.equal(c, p.to(copy))


def test_fused_adam_matches_torch_fused_adamw_over_steps():
    from dsfast.optim import FusedAdam
    base = [rand(n, torch.float32, i) for i, n in enumerate(SIZES)]
    ours = [torch.nn.Parameter(t.clone()) for t in base]
    theirs = [torch.nn.Parameter(t.clone()) for t in base]
    a = FusedAdam([{"params": ours[:5]}, {"params": ours[5:], "lr": 3e-3}], lr=1e-2, weight_decay=0.01)
    b = torch.optim.AdamW([{"params": theirs[:5]}, {"params": theirs[5:], "lr": 3e-3}], lr=1e-2,
                          weight_decay=0.01, fused=True)
    for s in range(5):
        for i, (p, q) in enumerate(zip(ours, theirs)):
            g = rand(p.numel(), torch.float32, 1000 * s + i)
            p.grad, q.grad = g.clone(), g.clone()
        a.step()
        b.step()
    compare(ours, theirs, torch.float32)
    for p, q in zip(ours, theirs):
        compare([a.state[p]["exp_avg_sq"]], [b.state[q]["exp_avg_sq"]], torch.float32)
        assert float(a.state[p]["step"]) == float(b.state[q]["step"]) == 5.0


def test_thousands_of_tensors_span_several_launches(op):
    g = torch.Generator().manual_seed(3)
    sizes = torch.randint(1, 3000, (3000,), generator=g).tolist()
    L = adam_inputs(sizes, torch.bfloat16, torch.float32, master=False, misalign_every=0)
    R = clone_lists(L)
    run_adam(op, L)
    run_adam(ref, R)
    compare(L["p"], R["p"], torch.float32)
    total, per, _ = op.l2_norm(L["g"], True)
    torch.testing.assert_close(per, torch.stack(torch._foreach_norm([t.float() for t in L["g"]])), rtol=1e-5, atol=0)
    exact = torch.cat([t.double() for t in L["g"]]).norm().float()  # a float32 cat().norm() is off by ~1e-5
    torch.testing.assert_close(total, exact, rtol=1e-5, atol=0)


def test_tensor_over_2_pow_31_elements(op):
    n = (1 << 31) + 5
    if DEV == "cpu" or torch.cuda.get_device_properties(0).total_memory < 48 * 2**30:
        pytest.skip("needs ~40 GiB of GPU memory")
    try:
        g = torch.full((n,), 0.5, dtype=torch.bfloat16, device=DEV)
        p, m, v = (torch.zeros(n, device=DEV) for _ in range(3))
        s = torch.ones((), device=DEV)
        op.adam_([g], [p], [m], [v], [s], [], 1e-2, 0.9, 0.999, 1e-8, 0.01, True, True)
        # Every element gets the same update: a 32-bit offset would leave the tail untouched
        # and update the head twice.
        rg = torch.full((8,), 0.5, dtype=torch.bfloat16, device=DEV)
        rp, rm, rv = (torch.zeros(8, device=DEV) for _ in range(3))
        ref.adam_([rg], [rp], [rm], [rv], [s.clone()], [], 1e-2, 0.9, 0.999, 1e-8, 0.01, True, True)
        for sl in (slice(0, 8), slice(n - 8, n), slice((1 << 31) - 4, (1 << 31) + 4)):
            torch.testing.assert_close(p[sl], rp, rtol=1e-6, atol=0)
            torch.testing.assert_close(m[sl], rm, rtol=1e-6, atol=0)
            torch.testing.assert_close(v[sl], rv, rtol=1e-6, atol=0)
        del p, m, v
        total, _, _ = op.l2_norm([g], False)
        torch.testing.assert_close(total, torch.tensor(0.5 * n ** 0.5, device=DEV), rtol=1e-4, atol=0)
        g[-1] = float("inf")
        flag = torch.zeros((), device=DEV)
        op.unscale_and_check_([g], torch.tensor(2.0, device=DEV), flag)
        assert float(flag) == 1.0 and float(g[n - 2]) == 1.0
    finally:
        torch.cuda.empty_cache()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inf_and_nan_in_tails_raise_the_flag(op, dtype):
    """The only non-finite value is the last element: in the scalar tail after the vector body
    (17, 65539), or anywhere in a misaligned tensor (the scalar walk)."""
    for n, mis in ((17, False), (65539, False), (4097, True)):
        for bad in (float("inf"), float("nan")):
            g = rand(n, dtype, n, mis)
            g[-1] = bad
            expect = (g.float() * 0.5).to(dtype).float()
            flag = torch.zeros((), device=DEV)
            op.unscale_and_check_([rand(64, dtype, 1), g], torch.tensor(0.5, device=DEV), flag)
            assert float(flag) == 1.0, (n, mis, bad)
            torch.testing.assert_close(g[:-1].float(), expect[:-1], rtol=0, atol=0)
            flag2 = torch.zeros((), device=DEV)
            total, per, _ = op.l2_norm([rand(64, dtype, 2), g], True, None, flag2, 0.0)
            assert float(flag2) == 1.0 and not torch.isfinite(total) and not torch.isfinite(per[1])
            assert torch.isfinite(per[0])


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_overflow_flag_leaves_params_and_states_untouched(op, kind):
    L = adam_inputs(SIZES, torch.bfloat16, torch.bfloat16, master=True)
    before = clone_lists(L)
    flag = torch.ones((), device=DEV)
    if kind == "adam":
        run_adam(op, L, found_inf=flag, inv_scale=torch.tensor(0.5, device=DEV))
    else:
        op.sgd_(L["g"], L["p"], L["m"], L["c"], 0.1, 0.9, 0.0, 0.0, False, False, found_inf=flag)
    for k in L:
        for x, y in zip(L[k], before[k]):
            if k != "c":  # the model copies were never written (uninitialised memory stays as it was)
                assert torch.equal(x, y), k


def test_grad_scaler_on_cuda_skips_and_counts_like_torch():
    from dsfast.optim import FusedAdam
    base = [rand(n, torch.float32, i) for i, n in enumerate(SIZES[:6])]
    runs = []
    for make in (lambda ps: FusedAdam(ps, lr=1e-2), lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.0,
                                                                                  fused=True)):
        ps = [torch.nn.Parameter(t.clone()) for t in base]
        opt, scaler = make(ps), torch.amp.GradScaler(DEV, init_scale=2.0 ** 10)
        for s in range(4):
            scaler.scale(torch.ones((), device=DEV))
            for i, p in enumerate(ps):
                p.grad = rand(p.numel(), torch.float32, 50 * s + i) * scaler.get_scale()
            if s == 1:
                ps[2].grad[0] = float("nan")
            scaler.step(opt)
            scaler.update()
        runs.append((ps, opt, scaler.get_scale()))
    (a, oa, sa), (b, ob, sb) = runs
    assert sa == sb == 2.0 ** 9
    compare(a, b, torch.float32)
    assert float(oa.state[a[0]]["step"]) == float(ob.state[b[0]]["step"]) == 3.0


def test_unscale_norm_and_clip_match_torch(op):
    from dsfast.ops import multi_tensor as mt
    for dtype in DTYPES:
        ours = [rand(n, dtype, i) for i, n in enumerate(SIZES)]
        theirs = [t.clone() for t in ours]
        inv, f1, f2 = torch.tensor(1 / 64, device=DEV), torch.zeros((), device=DEV), torch.zeros((), device=DEV)
        mt.unscale_and_check_(ours, inv, f1)
        torch._amp_foreach_non_finite_check_and_unscale_(theirs, f2, inv)
        for x, y in zip(ours, theirs):
            assert torch.equal(x, y)
        assert float(f1) == float(f2) == 0.0
        params = [torch.nn.Parameter(torch.zeros_like(t)) for t in theirs]
        for p, t in zip(params, theirs):
            p.grad = t
        expect = torch.nn.utils.clip_grad_norm_(params, 0.25)
        total = mt.clip_grads_(ours, 0.25)
        torch.testing.assert_close(total, expect.float(), **tol(dtype))
        compare(ours, [p.grad for p in params], dtype)


def test_step_never_syncs_with_the_host():
    if DEV == "cpu":
        pytest.skip("sync debug mode needs CUDA")
    from dsfast.ops import multi_tensor as mt
    from dsfast.optim import FusedAdam
    ps = [torch.nn.Parameter(rand(n, torch.bfloat16, i)) for i, n in enumerate(SIZES)]
    opt = FusedAdam(ps, lr=1e-3, master_weights=True)
    scale, flag = torch.tensor(1024.0, device=DEV), torch.zeros((), device=DEV)
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()  # state initialisation may allocate; the steady state must not sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            flag.zero_()
            _, coef = mt.grad_norm_and_clip_coef([p.grad for p in ps], 1.0, inv_scale=1 / scale, found_inf=flag)
            opt.step(grad_scale=scale, found_inf=flag, clip_coef=coef)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_binding_argument_errors(op):
    if DEV == "cpu":
        pytest.skip("the binding's own messages")
    a = rand(8, torch.float32, 0)
    s = torch.ones((), device=DEV)
    with pytest.raises(RuntimeError, match="got 1 grads for 2 params"):
        op.adam_([a], [a, a], [a, a], [a, a], [s, s], [], 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    with pytest.raises(RuntimeError, match=r"grads\[0\] is on cpu"):
        op.adam_([a.cpu()], [a], [a], [a], [s], [], 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    with pytest.raises(RuntimeError, match=r"exp_avgs\[0\] is not contiguous"):
        op.adam_([a], [a], [a.view(2, 4).t()], [a], [s], [], 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    with pytest.raises(TypeError, match=r"grads\[1\] has dtype"):
        op.sgd_([a, a.half()], [a, a], [], [], 0.1, 0.0, 0.0, 0.0, False, False)
    with pytest.raises(RuntimeError, match=r"steps\[0\] must be a one-element float32"):
        op.adam_([a], [a], [a], [a], [s.double()], [], 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    with pytest.raises(TypeError, match="model_copies must be float16 or bfloat16"):
        op.adam_([a], [a], [a], [a], [s], [a], 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    with pytest.raises(RuntimeError, match="found_inf is on cpu"):
        op.sgd_([a], [a], [], [], 0.1, 0.0, 0.0, 0.0, False, False, found_inf=torch.zeros(()))


def test_opcheck_every_cuda_op():
    """torch.library.opcheck on each dsfast::cuda_* operator (schema, fake impl, mutation, autograd)."""
    from dsfast.ops import load, loaded_from
    load("cuda_optim")
    if loaded_from("cuda_optim") == "reference":
        pytest.skip("the native cuda_optim op did not build")
    dev = "cuda"
    ps = [torch.randn(9, device=dev), torch.randn(4, 3, device=dev)]
    gs = [torch.randn_like(p) for p in ps]
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    steps = [torch.ones((), device=dev) for _ in ps]
    copies = [torch.zeros_like(p, dtype=torch.bfloat16) for p in ps]
    inv, flag = torch.full((), 0.5, device=dev), torch.zeros((), device=dev)
    ops = torch.ops.dsfast
    torch.library.opcheck(ops.cuda_adam_.default, (gs, ps, ms, vs, steps, copies, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                                                   True, True, inv, None, flag, False))
    torch.library.opcheck(ops.cuda_sgd_.default, (gs, ps, ms, [], 0.1, 0.9, 0.0, 0.0, False, True, inv, None, None,
                                                  False))
    torch.library.opcheck(ops.cuda_unscale_and_check_.default, (gs, inv, flag))
    torch.library.opcheck(ops.cuda_l2_norm.default, (gs, True, inv, flag, 1.0))
