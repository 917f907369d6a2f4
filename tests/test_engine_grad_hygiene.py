"""Gradients the user clears or produces outside engine.backward (issue: silent wrong training at stage 0).

The buckets must mirror param.grad as torch has it: model.zero_grad(), a client optimizer's zero_grad, p.grad = None
and zero_grad(set_to_none=False) all clear; gradients from a plain loss.backward() are refused at step, never
silently left unreduced; two engine.backward() calls before one step add up.
"""
import os
import sys

import pytest
import torch

import dsfast

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed"))
from gan_common import engine_gan, torch_gan  # noqa: E402

PRECISIONS = ["fp32", "bf16", "fp16"]


STAGES = [0, 1, 2, 3]


def _cfg(precision, opt="SGD", lr=1.0, gas=1, stage=0):
    # gradient_clipping 0: the expected weights are exact sums of unclipped gradients (DeepSpeed clips at 1.0 when
    # the key is omitted, and a gradient of norm 1 is scaled by 1 / (1 + 1e-6))
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": gas, "steps_per_print": 1000,
           "optimizer": {"type": opt, "params": {"lr": lr}}, "zero_optimization": {"stage": stage},
           "gradient_clipping": 0.0}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":  # a power-of-two static scale keeps every gradient below exact
        cfg["fp16"] = {"enabled": True, "loss_scale": 1024}
    return cfg


def _one_weight(precision, **kw):
    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    engine, opt, _, _ = dsfast.initialize(model=model, model_parameters=model.parameters(),
                                          config=_cfg(precision, **kw), dist_init_required=False)
    return model, engine, opt


def _weight(engine):
    from dsfast.utils import safe_get_full_fp32_param
    return float(safe_get_full_fp32_param(engine.module.weight).reshape(()))


def _loss(engine, slope):
    """A loss whose gradient with respect to the weight is `slope` (x = 1)."""
    return engine(torch.ones(1, 1)).float().sum() * slope


def _other_loss(engine, slope):
    """The same loss through the module itself, not the engine: its backward is nobody's engine backward."""
    x = torch.ones(1, 1, dtype=engine.module.weight.dtype)
    return engine.module(x).float().sum() * slope


CLEARS = {
    "module.zero_grad()": lambda model, opt: model.zero_grad(),
    "zero_grad(set_to_none=False)": lambda model, opt: model.zero_grad(set_to_none=False),
    "p.grad = None": lambda model, opt: setattr(model.weight, "grad", None),
    "optimizer.zero_grad()": lambda model, opt: opt.zero_grad(),
}


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("clear", list(CLEARS))
def test_gradients_cleared_by_the_user_do_not_leak_into_the_next_step(precision, clear, stage):
    model, engine, opt = _one_weight(precision, stage=stage)
    # another backward through the model (a GAN generator's loss through the discriminator) leaves gradient 64
    _other_loss(engine, 64.0).backward()
    CLEARS[clear](model, opt)
    engine.backward(_loss(engine, 1.0))
    engine.step()
    assert _weight(engine) == -1.0  # SGD lr 1, gradient 1: moved by exactly 1, not 65


@pytest.mark.parametrize("precision", PRECISIONS)
def test_gradients_cleared_between_backward_and_step_are_not_applied(precision):
    model, engine, _ = _one_weight(precision)
    engine.backward(_loss(engine, 8.0))
    model.zero_grad()
    engine.backward(_loss(engine, 2.0))
    engine.step()
    assert _weight(engine) == -2.0


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_backward_that_is_not_the_engines_is_refused_at_step_with_the_fix(precision, stage):
    model, engine, _ = _one_weight(precision, stage=stage)
    _other_loss(engine, 1.0).backward()
    with pytest.raises(RuntimeError, match=r"\(weight\).*engine.backward\(loss\) instead of loss.backward\(\)"):
        engine.step()
    assert _weight(engine) == 0.0
    model.zero_grad()        # once cleared, the engine trains normally
    engine.backward(_loss(engine, 1.0))
    engine.step()
    assert _weight(engine) == -1.0


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("gas", [1, 2])
def test_plain_loss_backward_as_deepspeed_0_19_8(precision, gas, stage):
    # DeepSpeed 0.19.8 (#7665): loss.backward() on the engine's outputs is engine.backward(loss) at ZeRO stages 1-3
    # and in bf16 at stage 0; fp16 needs engine.scale(loss).backward(); stage 0 in fp32/fp16 refuses it (dsfast at
    # step(), see the test above).
    model, engine, _ = _one_weight(precision, gas=gas, stage=stage)
    supported = stage > 0 or precision == "bf16"
    for _micro in range(gas):
        loss = _loss(engine, 2.0)
        if not supported:
            loss.backward()
            for _ in range(gas - 1):   # the refusal comes at the boundary's step
                engine.step()
            with pytest.raises(RuntimeError, match="engine.backward\\(loss\\) instead of loss.backward"):
                engine.step()
            return
        if precision == "fp16":
            before = None if model.weight.grad is None else model.weight.grad.clone()
            with pytest.raises(RuntimeError, match="engine.scale\\(loss\\).backward\\(\\)"):
                loss.backward()
            after = model.weight.grad   # refused before any gradient was deposited
            assert (after is None and before is None) or torch.equal(after, before)
            loss = engine.scale(_loss(engine, 2.0))
        loss.backward()
        engine.step()
    assert engine.global_steps == 1 and engine.was_step_applied()
    assert _weight(engine) == -2.0   # exactly as engine.backward: gradient 2 averaged over the gas micro-steps
    # and it goes on training through engine.backward alike
    engine.backward(_loss(engine, 1.0))
    for _micro in range(gas - 1):
        engine.step()
        engine.backward(_loss(engine, 1.0))
    engine.step()
    assert _weight(engine) == -3.0


def test_out_backward_with_a_gradient_is_a_plain_backward_too():
    _, engine, _ = _one_weight("bf16", stage=2)
    out = engine(torch.ones(1, 1))
    out.backward(torch.full_like(out, 4.0))
    engine.step()
    assert _weight(engine) == -4.0


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("gas", [1, 2])
def test_two_backwards_before_one_step_add_up(precision, gas, stage):
    _, engine, _ = _one_weight(precision, gas=gas, stage=stage)
    for _micro in range(gas):
        engine.backward(_loss(engine, 1.0))
        engine.backward(_loss(engine, 3.0))
        engine.step()
    assert _weight(engine) == -4.0  # (1 + 3) per micro-step, averaged over the gas micro-steps


def test_gan_loop_two_engines_matches_plain_torch():
    """DeepSpeed's DCGAN example shape: two backward calls on D per step, G's backward runs through D. Before the
    fix, D's next step also applied G's deposit (Loss_D ended at 1.14 where DeepSpeed and torch reach 0.23)."""
    steps = 8
    want, want_g, want_d = torch_gan(steps)
    got, got_g, got_d = engine_gan(dsfast.initialize, steps, dist_init_required=False)
    # CPUAdam vs torch Adam: the same arithmetic up to float32 rounding of the update
    for (gd, gg), (wd, wg) in zip(got, want):
        assert gd == pytest.approx(wd, rel=1e-5, abs=1e-6) and gg == pytest.approx(wg, rel=1e-5, abs=1e-6)
    for a, b in zip(got_g + got_d, want_g + want_d):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_engine_local_rank_follows_local_rank_on_cpu(monkeypatch):
    _, engine, _ = _one_weight("fp32")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert engine.local_rank == 3
    monkeypatch.delenv("LOCAL_RANK")
    assert engine.local_rank == 0


def test_destroy_removes_the_hooks():
    model, engine, _ = _one_weight("fp32")
    engine.destroy()
    model(torch.ones(1, 1)).sum().backward()   # plain torch again: no engine hook sees this gradient
    assert model.weight.grad is not None and model.weight.grad.item() == 1.0
