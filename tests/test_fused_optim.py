"""FusedAdam / FusedSGD on CPU tensors (the pure-torch reference of the cuda_optim op) against
torch.optim: several steps, param groups, state-dict round trips both ways, GradScaler's
grad_scale/found_inf, master weights and argument errors. The same classes run the CUDA
kernel on GPU tensors (tests/gpu). Tolerances: fp32 rtol 1e-5 / atol 1e-6 (the kernels use
torch's formulas, differing only in rounding order)."""
import copy

import pytest
import torch

from dsfast.optim import FusedAdam, FusedSGD

SIZES = (1, 7, 17, 4097)
TOL = dict(rtol=1e-5, atol=1e-6)


def make_params(seed=0, sizes=SIZES, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=g).to(dtype)) for n in sizes]


def clone_params(ps):
    return [torch.nn.Parameter(p.detach().clone()) for p in ps]


def set_grads(step, *param_lists, scale=1.0):
    g = torch.Generator().manual_seed(100 + step)
    grads = [torch.randn(p.shape, generator=g) for p in param_lists[0]]
    for ps in param_lists:
        for p, gr in zip(ps, grads):
            p.grad = (gr * scale).to(p.dtype)


def groups(ps, lr2=3e-3):
    return [{"params": ps[:2]}, {"params": ps[2:], "lr": lr2, "weight_decay": 0.05}]


def assert_close_lists(a, b, **tol):
    for x, y in zip(a, b):
        torch.testing.assert_close(x.detach(), y.detach(), **(tol or TOL))


def assert_states_close(ours, theirs, keys):
    for p_o, p_t in zip([p for g in ours.param_groups for p in g["params"]],
                        [p for g in theirs.param_groups for p in g["params"]]):
        for k in keys:
            torch.testing.assert_close(torch.as_tensor(ours.state[p_o][k]).float(),
                                       torch.as_tensor(theirs.state[p_t][k]).float(), **TOL)


@pytest.mark.parametrize("adamw", [True, False])
def test_adam_matches_torch_with_param_groups(adamw):
    ours_p, ref_p = make_params(), None
    ref_p = clone_params(ours_p)
    ours = FusedAdam(groups(ours_p), lr=1e-2, weight_decay=0.01, adam_w_mode=adamw)
    torch_cls = torch.optim.AdamW if adamw else torch.optim.Adam
    ref = torch_cls(groups(ref_p), lr=1e-2, weight_decay=0.01)
    for s in range(5):
        set_grads(s, ours_p, ref_p)
        ours.step()
        ref.step()
    assert_close_lists(ours_p, ref_p)
    assert_states_close(ours, ref, ("exp_avg", "exp_avg_sq", "step"))


def test_adam_maximize_and_no_bias_correction():
    ours_p = make_params(1)
    ref_p = clone_params(ours_p)
    ours = FusedAdam(ours_p, lr=1e-2, maximize=True)
    ref = torch.optim.AdamW(ref_p, lr=1e-2, weight_decay=0.0, maximize=True)
    for s in range(3):
        set_grads(s, ours_p, ref_p)
        ours.step()
        ref.step()
    assert_close_lists(ours_p, ref_p)
    # Without bias correction the first step moves by lr * g / (|g| + eps/sqrt(1-b2)*...): check vs formula.
    p = torch.nn.Parameter(torch.zeros(4))
    opt = FusedAdam([p], lr=0.1, betas=(0.5, 0.75), eps=1e-8, bias_correction=False)
    p.grad = torch.tensor([1.0, -2.0, 4.0, 0.5])
    opt.step()
    m, v = 0.5 * p.grad, 0.25 * p.grad ** 2
    torch.testing.assert_close(p.detach(), -0.1 * m / (v.sqrt() + 1e-8), **TOL)


def test_adam_state_dict_round_trip_both_ways():
    base = make_params(2)
    ours_p, torch_p, cont_p = clone_params(base), clone_params(base), clone_params(base)
    ours = FusedAdam(groups(ours_p), lr=1e-2, weight_decay=0.01)
    cont = FusedAdam(groups(cont_p), lr=1e-2, weight_decay=0.01)
    for s in range(2):
        set_grads(s, ours_p, cont_p)
        ours.step()
        cont.step()
    # ours -> torch: torch continues where we stopped
    ref = torch.optim.AdamW(groups(torch_p), lr=1e-2, weight_decay=0.01)
    with torch.no_grad():
        for a, b in zip(torch_p, ours_p):
            a.copy_(b)
    ref.load_state_dict(copy.deepcopy(ours.state_dict()))
    # torch -> ours: a fresh FusedAdam continues from torch's state
    back_p = clone_params(ours_p)
    back = FusedAdam(groups(back_p), lr=1e-2, weight_decay=0.01)
    back.load_state_dict(copy.deepcopy(ref.state_dict()))
    for s in range(2, 4):
        set_grads(s, cont_p, torch_p, back_p)
        cont.step()
        ref.step()
        back.step()
    assert_close_lists(torch_p, cont_p)
    assert_close_lists(back_p, cont_p)
    assert_states_close(back, ref, ("exp_avg", "exp_avg_sq", "step"))
    st = back.state[back_p[0]]["step"]
    assert st.dtype == torch.float32 and st.dim() == 0 and float(st) == 4.0


def test_mixed_grad_dtypes_in_one_group_take_the_bucketed_path():
    ours_p = make_params(11)
    ref_p = clone_params(ours_p)
    for p in ours_p[::2]:
        if hasattr(p, "grad_dtype"):
            p.grad_dtype = None  # allow a bf16 gradient on an fp32 param (torch >= 2.10 checks)
    for cls, tcls, kw in ((FusedAdam, torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.01)),
                          (FusedSGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.2))):
        a_p, b_p = clone_params(ours_p), clone_params(ref_p)
        for p in a_p[::2]:
            if hasattr(p, "grad_dtype"):
                p.grad_dtype = None
        ours, ref = cls(a_p, **kw), tcls(b_p, **kw)
        for s in range(3):
            set_grads(s, a_p, b_p)
            for p, q in zip(a_p[::2], b_p[::2]):
                p.grad = p.grad.to(torch.bfloat16)
                q.grad = p.grad.float()
            ours.step()
            ref.step()
        assert_close_lists(a_p, b_p)


def test_adam_16bit_params_states_in_param_dtype():
    ps = make_params(3, dtype=torch.bfloat16)
    ref = [torch.nn.Parameter(p.detach().float()) for p in ps]
    opt = FusedAdam(ps, lr=1e-2)
    topt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0)
    set_grads(0, ps, ref)
    for p, r in zip(ps, ref):
        r.grad = p.grad.float()
    opt.step()
    topt.step()
    assert opt.state[ps[0]]["exp_avg"].dtype == torch.bfloat16
    assert_close_lists([p.float() for p in ps], ref, rtol=1e-2, atol=1e-2)


def test_adam_master_weights_write_the_model_copy_in_the_same_pass():
    ps = make_params(4, dtype=torch.bfloat16)
    ref = [torch.nn.Parameter(p.detach().float()) for p in ps]
    opt = FusedAdam(ps, lr=1e-3, weight_decay=0.01, master_weights=True)
    topt = torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.01)
    for s in range(3):
        set_grads(s, ps)
        for p, r in zip(ps, ref):
            r.grad = p.grad.float()
        opt.step()
        topt.step()
    for p, r in zip(ps, ref):
        master = opt.state[p]["master_param"]
        assert master.dtype == torch.float32 and opt.state[p]["exp_avg"].dtype == torch.float32
        torch.testing.assert_close(master, r.detach(), **TOL)
        assert torch.equal(p.detach(), master.to(torch.bfloat16))
    # The round trip keeps the fp32 master and moments (torch would round them to bf16).
    again = FusedAdam(clone_params(ps), lr=1e-3, weight_decay=0.01, master_weights=True)
    again.load_state_dict(opt.state_dict())
    q = again.param_groups[0]["params"][0]
    assert torch.equal(again.state[q]["master_param"], opt.state[ps[0]]["master_param"])
    assert torch.equal(again.state[q]["exp_avg_sq"], opt.state[ps[0]]["exp_avg_sq"])
    assert again.state[q]["master_param"].data_ptr() != opt.state[ps[0]]["master_param"].data_ptr()


def _scaled_run(make_opt, inf_at):
    ps = make_params(5)
    opt = make_opt(ps)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1000)
    scales = []
    for s in range(4):
        scaler.scale(torch.ones(()))  # as scaling the loss would: creates the scale tensor
        set_grads(s, ps, scale=scaler.get_scale())
        if s == inf_at:
            ps[1].grad[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return ps, opt, scales


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_grad_scaler_drives_the_fused_step_like_torch(name):
    if name == "adam":
        ours = lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.01)
        theirs = lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01)
    else:
        ours = lambda ps: FusedSGD(ps, lr=1e-2, momentum=0.9, weight_decay=0.01)
        theirs = lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=0.01)
    assert FusedAdam._step_supports_amp_scaling and FusedSGD._step_supports_amp_scaling
    ours_p, ours_opt, ours_scales = _scaled_run(ours, inf_at=2)
    ref_p, ref_opt, ref_scales = _scaled_run(theirs, inf_at=2)
    assert ours_scales == ref_scales == [1024.0, 1024.0, 512.0, 512.0]
    assert_close_lists(ours_p, ref_p)
    if name == "adam":  # the skipped step did not count
        assert float(ours_opt.state[ours_p[0]]["step"]) == 3.0
        assert_states_close(ours_opt, ref_opt, ("exp_avg", "exp_avg_sq", "step"))
    else:
        assert_states_close(ours_opt, ref_opt, ("momentum_buffer",))


@pytest.mark.parametrize("cls", [FusedAdam, FusedSGD])
def test_found_inf_skips_everything_and_grad_scale_clip_unscale(cls):
    kw = dict(lr=1e-2, momentum=0.9) if cls is FusedSGD else dict(lr=1e-2)
    ps = make_params(6)
    opt = cls(ps, **kw)
    set_grads(0, ps)
    opt.step()
    before = [p.detach().clone() for p in ps]
    state_before = copy.deepcopy(opt.state_dict())
    set_grads(1, ps)
    opt.step(found_inf=torch.ones(()))
    assert_close_lists(ps, before, rtol=0, atol=0)
    after = opt.state_dict()["state"]
    for k, st in state_before["state"].items():
        for key, val in st.items():
            assert torch.equal(torch.as_tensor(after[k][key]), torch.as_tensor(val)), key
    # grad_scale=s and clip_coef=c give the step of grads * c / s.
    a_p, b_p = clone_params(ps), clone_params(ps)
    a, b = cls(a_p, **kw), cls(b_p, **kw)
    set_grads(2, a_p, b_p)
    for p in a_p:
        p.grad.mul_(8.0)
    for p in b_p:
        p.grad.mul_(0.5)
    a.step(grad_scale=torch.tensor(8.0), clip_coef=torch.tensor(0.5), found_inf=torch.zeros(()))
    b.step()
    assert_close_lists(a_p, b_p)


def test_sgd_matches_torch_variants_and_state_dict():
    for kw in (dict(momentum=0.0), dict(momentum=0.9, nesterov=True, weight_decay=0.01),
               dict(momentum=0.8, dampening=0.3, maximize=True)):
        ours_p = make_params(7)
        ref_p = clone_params(ours_p)
        ours = FusedSGD(groups(ours_p), lr=0.05, **kw)
        ref = torch.optim.SGD(groups(ref_p), lr=0.05, **kw)
        for s in range(2):
            set_grads(s, ours_p, ref_p)
            ours.step()
            ref.step()
        # swap state mid-run in both directions, then continue
        back_p = clone_params(ours_p)
        back = FusedSGD(groups(back_p), lr=0.05, **kw)
        back.load_state_dict(copy.deepcopy(ref.state_dict()))
        ref2_p = clone_params(ours_p)
        ref2 = torch.optim.SGD(groups(ref2_p), lr=0.05, **kw)
        ref2.load_state_dict(copy.deepcopy(ours.state_dict()))
        for s in range(2, 4):
            set_grads(s, ours_p, ref_p, back_p, ref2_p)
            for o in (ours, ref, back, ref2):
                o.step()
        for other in (ref_p, back_p, ref2_p):
            assert_close_lists(ours_p, other)
        if kw["momentum"]:
            assert_states_close(ours, ref, ("momentum_buffer",))


def test_sgd_dampening_with_buffers_born_at_different_steps():
    ours_p = make_params(12)
    ref_p = clone_params(ours_p)
    ours = FusedSGD(ours_p, lr=0.05, momentum=0.9, dampening=0.3)
    ref = torch.optim.SGD(ref_p, lr=0.05, momentum=0.9, dampening=0.3)
    for s in range(3):
        set_grads(s, ours_p, ref_p)
        if s == 0:  # params 1 and 3 get no gradient on the first step: their buffers start later
            for ps in (ours_p, ref_p):
                ps[1].grad = ps[3].grad = None
        ours.step()
        ref.step()
    assert_close_lists(ours_p, ref_p)
    assert_states_close(ours, ref, ("momentum_buffer",))


def test_sgd_skipped_first_step_keeps_torch_semantics():
    ours_p = make_params(8)
    ref_p = clone_params(ours_p)
    ours = FusedSGD(ours_p, lr=0.05, momentum=0.9)
    ref = torch.optim.SGD(ref_p, lr=0.05, momentum=0.9)
    set_grads(0, ours_p)
    ours.step(found_inf=torch.ones(()))  # skipped: the buffer must act as if never used
    for s in range(1, 3):
        set_grads(s, ours_p, ref_p)
        ours.step()
        ref.step()
    assert_close_lists(ours_p, ref_p)


def test_sgd_master_weights():
    ps = make_params(9, dtype=torch.float16)
    ref = [torch.nn.Parameter(p.detach().float()) for p in ps]
    opt = FusedSGD(ps, lr=0.05, momentum=0.9, master_weights=True)
    topt = torch.optim.SGD(ref, lr=0.05, momentum=0.9)
    for s in range(2):
        set_grads(s, ps)
        for p, r in zip(ps, ref):
            r.grad = p.grad.float()
        opt.step()
        topt.step()
    for p, r in zip(ps, ref):
        torch.testing.assert_close(opt.state[p]["master_param"], r.detach(), **TOL)
        assert torch.equal(p.detach(), opt.state[p]["master_param"].half())


def test_errors_are_clear():
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="amsgrad"):
        FusedAdam([p], amsgrad=True)
    with pytest.raises(ValueError, match="learning rate"):
        FusedAdam([p], lr=-1.0)
    with pytest.raises(ValueError, match="beta"):
        FusedAdam([p], betas=(0.9, 1.5))
    with pytest.raises(ValueError, match="nesterov"):
        FusedSGD([p], lr=0.1, nesterov=True)
    with pytest.raises(TypeError, match="master_weights"):
        FusedAdam([p], master_weights="yes")
    opt = FusedAdam([p])
    if hasattr(p, "grad_dtype"):
        p.grad_dtype = None  # torch >= 2.10 checks grad dtypes on assignment unless told not to
    p.grad = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"\['params'\]\[0\]\.grad has dtype torch.float64"):
        opt.step()
    p.grad = torch.zeros(3).to_sparse()
    with pytest.raises(TypeError, match="sparse"):
        opt.step()
    q = torch.nn.Parameter(torch.zeros(4, 4).t())
    q.grad = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="not contiguous"):
        FusedSGD([q], lr=0.1).step()
    p.grad = torch.zeros(3)
    with pytest.raises(TypeError, match="found_inf must be float32"):
        opt.step(found_inf=torch.zeros((), dtype=torch.float64))
    with pytest.raises(TypeError, match="grad_scale must be a one-element tensor"):
        opt.step(grad_scale=2.0)


def test_cuda_op_unavailable_is_a_clear_error(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the op may well be available")
    from dsfast.ops import DsfastOpError, DsfastOpWarning, loader, multi_tensor
    monkeypatch.setattr(loader, "_loaded", {})
    monkeypatch.setattr(loader, "_failed", {})
    monkeypatch.setattr(loader, "_announced", set())
    monkeypatch.setenv("DSFAST_REQUIRE_OPS", "1")
    with pytest.raises(DsfastOpError, match="cuda_optim"):
        multi_tensor.backend("cuda")
    monkeypatch.setattr(loader, "_failed", {})
    monkeypatch.delenv("DSFAST_REQUIRE_OPS")
    with pytest.warns(DsfastOpWarning, match="cuda_optim.*reference"):
        mod = multi_tensor.backend("cuda")
    assert mod.__name__ == "dsfast.ops.reference.portable_multi_tensor"
