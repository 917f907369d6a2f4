"""The step's gradient norms taken as each unit's reduction lands (zero/step/landed_norms.py): the step then reuses
them, bit for bit what it would take itself; a gradient written after it landed is measured again."""
import pytest
import torch

import dsfast
from dsfast.zero.step.clip_arith import piece_norms

from _overlap_helpers import batch, config, model


def _engine(stage, precision="fp32"):
    m = model()
    cfg = config(stage, precision, overlap=False, clip=0.5)
    cfg["zero_optimization"].pop("offload_optimizer")
    engine, *_ = dsfast.initialize(model=m, model_parameters=m.parameters(), config=cfg)
    return engine


def _train(engine, steps, dtype):
    for i in range(steps):
        x, y = batch(i, dtype)
        engine.backward((engine(x).float() - y).square().mean())
        engine.step()


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_norms_taken_as_units_land_are_the_steps_own(stage, precision):
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    engine = _engine(stage, precision)
    owner = engine.state_owner
    _train(engine, 2, dtype)   # (the first step tells the owner that norms are wanted: clipping)
    x, y = batch(5, dtype)
    engine.backward((engine(x).float() - y).square().mean())
    keyed = owner.landed_norms.keyed()
    landed = owner.landed_norms.for_step(keyed)
    assert landed is not None, "the units' norms were not taken as their reductions landed"
    fresh = piece_norms([(k[0], t) for k, t in keyed], stage)
    assert len(landed) == len(fresh) and all(torch.equal(a, b) for a, b in zip(landed, fresh))
    # a gradient written after it landed (a setter) makes the step measure again
    p = next(iter(engine.module.parameters()))
    dsfast.utils.safe_set_full_grad(p, torch.ones(tuple(getattr(p, "ds_shape", p.shape))))   # (stage 3: p is empty)
    assert owner.landed_norms.for_step(owner.landed_norms.keyed()) is None
    engine.step()
    engine.destroy()


def test_without_clipping_or_an_overflow_check_no_norms_are_taken():
    m = model()
    cfg = config(2, overlap=False, clip=0.0)
    cfg["zero_optimization"].pop("offload_optimizer")
    engine, *_ = dsfast.initialize(model=m, model_parameters=m.parameters(), config=cfg)
    _train(engine, 2, torch.float32)
    x, y = batch(5)
    engine.backward((engine(x) - y).square().mean())
    assert not engine.state_owner.landed_norms.wanted
    assert engine.state_owner.landed_norms.for_step(engine.state_owner.landed_norms.keyed()) is None
    engine.destroy()
