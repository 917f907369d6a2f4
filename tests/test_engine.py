"""Engine semantics in one process (no process group): accumulation, fp16 overflow skip, bf16, clients, errors."""
import copy

import pytest
import torch

import dsfast
from dsfast.engine import NoOptimizerError

MICRO = 4


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(i, n=MICRO):
    g = torch.Generator().manual_seed(i)
    return torch.randn(n, 8, generator=g), torch.randn(n, 4, generator=g)


def config(**over):
    # gradient_clipping 0: these tests compare with unclipped torch training (the 1.0 default is
    # test_deepspeed_defaults.py's)
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
           "gradient_clipping": 0.0, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
    cfg.update(over)
    return cfg


def init(model=None, **kw):
    model = model or make_model()
    kw.setdefault("model_parameters", model.parameters())
    kw.setdefault("config", config())
    return dsfast.initialize(model=model, dist_init_required=False, **kw)


def mse(engine, x, y):
    return torch.nn.functional.mse_loss(engine(x).float(), y)


def test_accumulation_steps_only_at_boundary_and_matches_torch_on_concatenated_batch():
    gas = 3
    engine, opt, _, _ = init(config=config(gradient_accumulation_steps=gas))
    ref = make_model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    start = [p.detach().clone() for p in engine.module.parameters()]
    boundaries = []
    for step in range(2):
        xs, ys = zip(*[batch(10 * step + i) for i in range(gas)])
        for i in range(gas):
            boundaries.append(engine.is_gradient_accumulation_boundary())
            engine.backward(mse(engine, xs[i], ys[i]))
            engine.step()
            if step == 0 and i < gas - 1:  # nothing moves before the boundary
                assert all(torch.equal(a, b) for a, b in zip(start, engine.module.parameters()))
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
    assert boundaries == [False, False, True] * 2
    assert (engine.global_steps, engine.micro_steps, engine.global_samples) == (2, 6, 2 * gas * MICRO)
    for a, b in zip(engine.module.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)


def test_backward_scales_loss_by_one_over_gas():
    engine, _, _, _ = init(config=config(gradient_accumulation_steps=4))
    ref = make_model()
    x, y = batch(0)
    engine.backward(mse(engine, x, y))
    torch.nn.functional.mse_loss(ref(x), y).backward()
    for p, r in zip(engine.module.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad / 4)


def test_clipping_equals_torch_clip_grad_norm():
    engine, _, _, _ = init(config=config(gradient_clipping=0.01, optimizer={"type": "SGD", "params": {"lr": 0.1}}))
    ref = make_model()
    x, y = batch(3)
    engine.backward(mse(engine, x, y))
    engine.step()
    torch.nn.functional.mse_loss(ref(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.01)
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    assert float(norm) > 0.01 and engine.get_global_grad_norm() == pytest.approx(float(norm), rel=1e-6)
    for a, b in zip(engine.module.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)


def _fp16_engine(clip=0.0, **fp16):
    sched = {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": 1e-2}}
    return init(config=config(fp16={"enabled": True, **fp16}, scheduler=sched, gradient_clipping=clip))


def masters_of(engine):
    """The fp32 masters stage 0 steps: the optimizer's parameters (the owner built it over them)."""
    return [m for g in engine.optimizer.param_groups for m in g["params"]]


def _snapshot(engine, opt, sched):
    masters = masters_of(engine)
    return ([m.detach().clone() for m in masters],
            [{k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[m].items()} for m in masters],
            copy.deepcopy(sched.state_dict()), [p.detach().clone() for p in engine.module.parameters()])


def _assert_same(a, b):
    for x, y in zip(a[0] + a[3], b[0] + b[3]):
        assert torch.equal(x, y)
    for s, t in zip(a[1], b[1]):
        assert s.keys() == t.keys() and all(torch.equal(s[k], t[k]) if torch.is_tensor(s[k]) else s[k] == t[k]
                                            for k in s)
    assert a[2] == b[2]


def test_fp16_overflow_skips_step_and_scheduler_and_leaves_no_nan():
    engine, opt, _, sched = _fp16_engine(initial_scale_power=10, hysteresis=2)
    assert next(engine.module.parameters()).dtype == torch.float16
    assert engine.loss_scale == 1024
    engine.backward(mse(engine, *batch(0)))
    engine.step()
    assert engine.was_step_applied()
    before = _snapshot(engine, opt, sched)
    lr_before = engine.get_lr()
    for k in range(2):  # hysteresis 2: first overflow keeps the scale, second halves it
        engine.backward(mse(engine, *batch(1)) * float("inf"))
        engine.step()
        assert not engine.was_step_applied()
        _assert_same(before, _snapshot(engine, opt, sched))
        assert engine.get_lr() == lr_before
    assert (engine.global_steps, engine.skipped_steps, engine.loss_scale) == (3, 2, 512)
    engine.backward(mse(engine, *batch(2)))
    engine.step()
    assert engine.was_step_applied() and engine.get_lr() != lr_before
    for t in masters_of(engine) + list(engine.module.parameters()):
        assert torch.isfinite(t).all()
    for s in opt.state.values():
        assert all(torch.isfinite(v).all() for v in s.values() if torch.is_tensor(v))


def test_fp16_static_scale_with_clipping_skips_overflow_without_changing_scale():
    # with clipping, the overflow is found through the global norm (the other path than unscale_and_check_)
    engine, opt, _, sched = _fp16_engine(clip=1.0, loss_scale=128)
    engine.backward(mse(engine, *batch(0)))
    engine.step()
    before = _snapshot(engine, opt, sched)
    engine.backward(mse(engine, *batch(1)) * float("nan"))
    engine.step()
    _assert_same(before, _snapshot(engine, opt, sched))
    assert (engine.loss_scale, engine.skipped_steps) == (128, 1)
    engine.backward(mse(engine, *batch(2)))
    engine.step()
    assert engine.was_step_applied() and 0 < engine.get_global_grad_norm() < float("inf")


def test_fp16_overflow_at_floor_is_a_clear_error():
    from dsfast.precision import LossScaleUnderflowError
    engine, _, _, _ = _fp16_engine(initial_scale_power=1, min_loss_scale=1, hysteresis=1)
    for _ in range(2):
        engine.backward(mse(engine, *batch(0)) * float("inf"))
        if engine.loss_scale > 1:
            engine.step()
    with pytest.raises(LossScaleUnderflowError, match="bf16"):
        engine.step()


def test_fp16_trains_on_cpu():
    engine, _, _, _ = _fp16_engine(initial_scale_power=8)
    x, y = batch(0, 16)
    losses = []
    for _ in range(30):
        loss = mse(engine, x, y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0] and engine.skipped_steps == 0


def test_bf16_model_in_bf16_masters_and_optimizer_in_fp32():
    engine, opt, _, _ = init(config=config(bf16={"enabled": True}))
    assert all(p.dtype == torch.bfloat16 for p in engine.module.parameters())
    masters = [dsfast.utils.safe_get_full_fp32_param(p) for p in engine.module.parameters()]
    assert all(m.dtype == torch.float32 for m in masters)
    assert [m.dtype for g in opt.param_groups for m in g["params"]] == [torch.float32] * len(masters)
    x, y = batch(0)
    engine.backward(mse(engine, x, y))  # fp32 input is cast to the model's bf16
    engine.step()
    masters = [dsfast.utils.safe_get_full_fp32_param(p) for p in engine.module.parameters()]
    for p, m in zip(engine.module.parameters(), masters):
        assert torch.equal(p, m.to(torch.bfloat16))


def test_bf16_non_finite_gradients_skip_the_step():
    # DeepSpeed 0.19's bf16.check_grad_overflow (default true): no loss scale, but no NaN reaches the weights
    engine, opt, _, _ = init(config=config(bf16={"enabled": True}))
    engine.backward(mse(engine, *batch(0)))
    engine.step()
    masters = [dsfast.utils.safe_get_full_fp32_param(p) for p in engine.module.parameters()]
    engine.backward(mse(engine, *batch(1)) * float("nan"))
    engine.step()
    assert not engine.was_step_applied() and engine.skipped_steps == 1 and engine.global_steps == 2
    assert all(torch.equal(a, dsfast.utils.safe_get_full_fp32_param(p))
               for a, p in zip(masters, engine.module.parameters()))
    assert all(torch.isfinite(p).all() for p in engine.module.parameters())


def test_client_optimizer_object_wins_over_config_with_a_warning():
    model = make_model()
    client = torch.optim.SGD(model.parameters(), lr=0.5)
    with pytest.warns(UserWarning, match="client optimizer"):
        engine, opt, _, _ = init(model, optimizer=client, config=config())
    assert opt is client and engine.optimizer is client
    p0 = [p.detach().clone() for p in model.parameters()]
    engine.backward(mse(engine, *batch(0)))
    grads = [p.grad.clone() for p in model.parameters()]
    engine.step()
    for p, a, g in zip(model.parameters(), p0, grads):
        torch.testing.assert_close(p, a - 0.5 * g)


def test_client_optimizer_is_retargeted_at_fp32_masters_in_bf16():
    model = make_model()
    client = torch.optim.SGD(model.parameters(), lr=0.5)
    engine, opt, _, _ = init(model, optimizer=client, config={"train_batch_size": MICRO, "bf16": {"enabled": True},
                                                          "gradient_clipping": 0.0})
    masters = opt.param_groups[0]["params"]   # the fp32 masters, not the model's bf16 parameters
    assert all(m.dtype == torch.float32 for m in masters) and len(masters) == len(list(model.parameters()))
    assert all(torch.equal(m, dsfast.utils.safe_get_full_fp32_param(p)) for m, p in zip(masters, model.parameters()))
    m0 = [m.detach().clone() for m in masters]
    engine.backward(mse(engine, *batch(0)))
    grads = [m.grad.clone() for m in masters]
    engine.step()
    for m, a, g in zip(masters, m0, grads):
        torch.testing.assert_close(m, a - 0.5 * g)
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(model.parameters(), masters))


def test_client_optimizer_callable_and_client_scheduler_callable():
    engine, opt, _, sched = init(optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
                                 lr_scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5),
                                 config={"train_batch_size": MICRO})
    assert isinstance(opt, torch.optim.SGD) and isinstance(sched, torch.optim.lr_scheduler.StepLR)
    engine.backward(mse(engine, *batch(0)))
    engine.step()
    assert engine.get_lr() == [0.05]


def test_frozen_model_without_optimizer_runs_eval_and_refuses_backward():
    model = make_model()
    for p in model.parameters():
        p.requires_grad_(False)
    engine, opt, loader, sched = dsfast.initialize(model=model, config=config(), dist_init_required=False)
    assert opt is None and loader is None and sched is None
    engine.eval()
    assert not engine.module.training
    x, _ = batch(0)
    torch.testing.assert_close(engine(x), model(x))
    with pytest.raises(NoOptimizerError, match="no trainable parameters"):
        engine.backward(engine(x).sum())


def test_default_cpu_optimizer_is_dsfast_cpu_adam():
    from dsfast.optim import CPUAdam
    _, opt, _, _ = init()
    assert isinstance(opt, CPUAdam)


def test_properties():
    engine, _, _, _ = init(config=config(gradient_accumulation_steps=2))
    assert (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
            engine.gradient_accumulation_steps(), engine.zero_optimization_stage()) == (8, 4, 2, 0)
    assert engine.device == torch.device("cpu") and engine.loss_scale == 1.0 and engine.get_lr() == [1e-2]
    assert isinstance(engine, dsfast.DeepSpeedEngine) and dsfast.Engine is dsfast.DeepSpeedEngine
    engine.train()
    assert engine.module.training
    engine.eval()
    assert not engine.module.training
    engine.module.custom_attribute = 7
    assert engine.custom_attribute == 7  # unknown attributes forward to the module (as DeepSpeed)


def test_progress_prints_every_steps_per_print_on_rank0_only(capsys):
    engine, _, _, _ = init(config=config(steps_per_print=2, wall_clock_breakdown=True))
    for i in range(5):
        engine.backward(mse(engine, *batch(i)))
        engine.step()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[dsfast]")]
    assert [line.split("|")[0].strip() for line in lines] == ["[dsfast] step 2", "[dsfast] step 4"]
    assert "loss " in lines[0] and "lr 1.00e-02" in lines[0] and "samples/s" in lines[0]
    assert "loss scale 1 " in lines[0]
    assert "fwd " in lines[0] and "bwd " in lines[0] and "step " in lines[0].split("|")[-1]  # wall_clock_breakdown


def test_no_sync_skips_reduction_even_at_a_boundary():
    engine, _, _, _ = init()
    calls = []
    begin = engine.state_owner.begin_backward
    engine.state_owner.begin_backward = lambda reduce: (calls.append(reduce), begin(reduce))
    with engine.no_sync():
        engine.backward(mse(engine, *batch(0)))
    engine.backward(mse(engine, *batch(1)))
    assert calls == [False, True]


def test_engine_state_dict_round_trip():
    engine, _, _, _ = _fp16_engine(initial_scale_power=6)
    for i in range(3):
        engine.backward(mse(engine, *batch(i)) * (float("inf") if i == 1 else 1.0))
        engine.step()
    state = engine.engine_state_dict()
    assert (state["global_steps"], state["skipped_steps"], state["micro_steps"]) == (3, 1, 3)
    other, _, _, _ = _fp16_engine(initial_scale_power=6)
    other.load_engine_state_dict(state)
    assert other.engine_state_dict() == state and other.loss_scale == engine.loss_scale


def test_initializing_the_same_model_twice_leaves_only_the_new_engine_in_charge():
    model = make_model()
    first, _, _, _ = init(model)
    second, _, _, _ = init(model, config=config(gradient_accumulation_steps=2))
    ref = make_model()
    for i in range(2):  # two micro-steps accumulate
        x, y = batch(i)
        second.backward(mse(second, x, y))
        if i == 0:
            second.step()  # not a boundary yet: only counts the micro-step
        torch.nn.functional.mse_loss(ref(x), y).backward()
    for p, r in zip(model.parameters(), ref.parameters()):
        # p.grad lives in the new engine's gradient buckets (stage 0: param.grad are views of them)
        assert any(p.grad.untyped_storage().data_ptr() == g.untyped_storage().data_ptr()
                   for g in second.state_owner.memory_tensors()["grads"])
        torch.testing.assert_close(p.grad, r.grad / 2)


def test_checkpoint_methods_are_engine_methods_not_module_attributes(tmp_path):
    engine, _, _, _ = init()
    path = engine.save_checkpoint(str(tmp_path), client_sd={"step": 1})
    assert path == str(tmp_path / "global_step0")
    assert engine.load_checkpoint(str(tmp_path)) == (path, {"step": 1})


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_torch_autocast_runs_forward_in_the_autocast_dtype_with_fp32_weights(dtype):
    """DeepSpeed 0.19's torch_autocast: weights and gradients stay fp32, the forward computes in `dtype`;
    float16 also scales the loss (dynamic loss scale) and unscales before the step."""
    model = make_model()
    ref = make_model()
    cfg = config(torch_autocast={"enabled": True, "dtype": dtype})
    engine, _, _, _ = init(model, config=cfg)
    seen = []
    engine.module[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    x, y = batch(0)
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
    engine.step()
    want = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    assert seen == [want] and all(p.dtype == torch.float32 for p in model.parameters())
    assert (engine.loss_scaler is not None) == (dtype == "fp16")
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    with torch.autocast("cpu", dtype=want):
        out = ref(x)
    torch.nn.functional.mse_loss(out.float(), y).backward()
    opt.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
