"""Every stage's step decision (zero/step/decide.py) and the optimizer contract (optim/amp_step.py).

The decision used to exist three times (stage 0's unscale pass, the device path, the ZeRO shards' squared-norm) and
the copies disagreed: a finite bf16 gradient of 1e22 was applied at stage 0 and skipped as "non-finite" at stages
1-3 (its square overflows fp32). These tests pin one answer for every stage.
"""
import math

import pytest
import torch

import dsfast
import dsfast.zero.step.decide as decide_module
from dsfast.optim import CPUAdam, FusedAdam
from dsfast.optim.amp_step import amp_step
from dsfast.zero.step.decide import decide


@pytest.mark.parametrize("exact", [False, True])
def test_a_huge_finite_gradient_is_no_overflow_and_its_norm_is_finite(monkeypatch, exact):
    monkeypatch.setattr(decide_module, "exact_on_device", lambda device: exact)
    grads = [torch.tensor([1e22, 3.0]), torch.tensor([2e22], dtype=torch.bfloat16)]
    d = decide(grads, factor=0.5, clip=1.0, check_overflow=True)
    want = math.sqrt(1e44 + 9.0 + float(torch.tensor(2e22, dtype=torch.bfloat16)) ** 2) * 0.5
    assert float(d.found_inf) == 0.0 and d.applied()
    assert float(d.norm) == pytest.approx(want, rel=1e-6)
    assert float(d.clip_coef) == pytest.approx(1.0 / (want + 1e-6), rel=1e-6)
    assert float(d.grad_scale) == 2.0


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_any_non_finite_element_is_an_overflow(monkeypatch, exact, bad):
    monkeypatch.setattr(decide_module, "exact_on_device", lambda device: exact)
    grads = [torch.ones(100), torch.tensor([1e22, bad, 1.0])]
    d = decide(grads, factor=1.0, clip=0.0, check_overflow=True)
    assert float(d.found_inf) == 1.0 and not d.applied()
    assert d.clip_coef is None and d.grad_scale is None


def test_nothing_is_computed_when_neither_clipping_nor_checking():
    d = decide([torch.full((4,), float("inf"))], factor=0.25, clip=0.0, check_overflow=False)
    assert d.found_inf is None and d.norm is None and d.clip_coef is None and d.applied()
    assert float(d.grad_scale) == 4.0


def test_clip_coefficient_is_deepspeeds_and_never_above_one():
    g = [torch.tensor([3.0, 4.0])]   # norm 5
    assert float(decide(g, 1.0, 1.0, False).clip_coef) == pytest.approx(1.0 / (5.0 + 1e-6))
    assert float(decide(g, 1.0, 10.0, False).clip_coef) == 1.0


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _engine(stage, cfg_extra, optimizer=None):
    model = _model()
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000, "zero_optimization": {"stage": stage},
           **cfg_extra}
    if optimizer is None:
        cfg.setdefault("optimizer", {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}})
    opt = optimizer(model.parameters()) if optimizer else None
    return dsfast.initialize(model=model, model_parameters=model.parameters(), optimizer=opt, config=cfg,
                             dist_init_required=False)[0]


def _batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


@pytest.mark.parametrize("clip", [0.0, 1.0])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_bf16_huge_finite_gradient_is_applied_at_every_stage(stage, clip):
    engine = _engine(stage, {"bf16": {"enabled": True, "check_grad_overflow": True}, "gradient_clipping": clip})
    x, y = _batch(0)
    before = [p.detach().float().clone() for p in engine.module.parameters()]
    # a loss multiplier of 1e22 gives gradients around 1e21-1e22: finite in bf16, their squares past fp32's range
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y) * 1e22)
    engine.step()
    assert engine.was_step_applied() and engine.skipped_steps == 0
    if clip:
        assert 1e20 < engine.get_global_grad_norm() < 1e24
    after = list(engine.module.parameters())
    if stage == 3:
        from dsfast.utils import safe_get_full_fp32_param
        after = [safe_get_full_fp32_param(p) for p in after]
    for a, b in zip(after, before):
        assert torch.isfinite(a.float()).all() and not torch.equal(a.float(), b)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_non_finite_gradient_is_skipped_at_every_stage(stage):
    engine = _engine(stage, {"bf16": {"enabled": True, "check_grad_overflow": True}, "gradient_clipping": 1.0})
    x, y = _batch(0)
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y) * float("inf"))
    engine.step()
    assert not engine.was_step_applied() and engine.skipped_steps == 1


def _train(engine, steps=4):
    for i in range(steps):
        x, y = _batch(i)
        engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
        engine.step()
    return [p.detach().float().clone() for p in engine.module.parameters()]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_fused_adam_without_decoupled_decay_steps_adam_at_zero_stages(stage):
    # FusedAdam keeps adam_w_mode on the instance: the ZeRO step used to read it from the param group (absent, so
    # AdamW) on a GPU. There is one path now, the one a GPU takes: FusedAdam's per-unit entry
    # (prepare_amp_step(clip_coef=, ...), then step(parts) with the gradients), as amp_step.prepare_step calls it.
    calls = []
    got_engine = _engine(stage, {"gradient_clipping": 0.5},
                         optimizer=lambda ps: FusedAdam(ps, lr=1e-2, weight_decay=0.1, adam_w_mode=False))
    prepare = got_engine.optimizer.prepare_amp_step
    got_engine.optimizer.prepare_amp_step = lambda **k: (calls.append(sorted(k)), prepare(**k))[1]
    got = _train(got_engine)
    want = _train(_engine(0, {"gradient_clipping": 0.5},
                          optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1)))
    adamw = _train(_engine(0, {"gradient_clipping": 0.5},
                           optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)))
    assert calls and all("clip_coef" in c for c in calls)
    if stage == 3:
        from dsfast.utils import safe_get_full_fp32_param
        got = [safe_get_full_fp32_param(p) for p in got_engine.module.parameters()]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert max((a - b).abs().max() for a, b in zip(want, adamw)) > 1e-4   # the two rules do differ here


def test_config_adam_without_adam_w_mode_is_adam_at_zero_stage_2():
    cfg = {"gradient_clipping": 0.5, "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.1,
                                                                           "adam_w_mode": False}}}
    got = _train(_engine(2, cfg))
    want = _train(_engine(0, {"gradient_clipping": 0.5},
                          optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1)))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("cls", ["cpu", "fused", "torch"])
def test_the_contract_skips_scales_clips_and_writes_out16(cls):
    torch.manual_seed(0)
    p = torch.randn(37)
    g16 = torch.randn(37).to(torch.bfloat16)

    def make():
        q = torch.nn.Parameter(p.clone())
        if cls == "cpu":
            return q, CPUAdam([q], lr=0.1)
        if cls == "fused":
            return q, FusedAdam([q], lr=0.1)
        return q, torch.optim.AdamW([q], lr=0.1, weight_decay=0.0)

    q, opt = make()
    out = torch.zeros(37, dtype=torch.bfloat16)
    amp_step(opt, grads=[[g16]], grad_scale=torch.tensor(4.0, dtype=torch.float64), found_inf=torch.tensor(1.0),
             clip_coef=torch.tensor(0.5), out16=[[out]])
    assert torch.equal(q.detach(), p) and not out.any()   # skipped: nothing moved
    # (FusedAdam makes its state on the device before it can know; it stays at step 0 with zero moments)
    assert all(not t.any() for t in opt.state.get(q, {}).values())
    amp_step(opt, grads=[[g16]], grad_scale=torch.tensor(4.0, dtype=torch.float64), found_inf=torch.tensor(0.0),
             clip_coef=torch.tensor(0.5), out16=[[out]])
    ref = torch.nn.Parameter(p.clone())
    ref_opt = torch.optim.AdamW([ref], lr=0.1, weight_decay=0.0)
    ref.grad = g16.float() * 0.125
    ref_opt.step()
    torch.testing.assert_close(q.detach(), ref.detach(), atol=1e-6, rtol=1e-6)
    assert torch.equal(out, q.detach().to(torch.bfloat16))
    assert q.grad is None   # the contract's gradients are not left on the parameter
