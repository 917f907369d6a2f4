"""managed_gradient_accumulation=false in one process, as DeepSpeed 0.19.8 (runtime/engine.py) defines it: every
step() is the boundary and applies an update whatever gradient_accumulation_steps says; backward() still divides
the loss by it; is_gradient_accumulation_boundary() is True only inside step(); global_samples counts the
micro-batches actually accumulated; set_gradient_accumulation_boundary() and step() inside no_sync() are refused,
and so is overlap_comm below stage 2. Checked against DeepSpeed 0.19.8's recorded run of the same program too.
The 2-rank runs are tests/distributed/test_unmanaged_accumulation_dp.py."""
import os
import sys

import pytest
import torch

import dsfast
from _deepspeed_cases import load_golden, unmanaged_trace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed"))
from dp_common import MICRO  # noqa: E402
from unmanaged_common import COUNTS, config, reference, train  # noqa: E402


def _init(**kw):
    return dsfast.initialize(dist_init_required=False, **kw)


def test_the_same_runs_as_deepspeed_0_19_8_recorded():
    # DeepSpeed 0.19.8 on CPU, the same program (tests/data/deepspeed_unmanaged_accumulation.json)
    assert unmanaged_trace(_init, dsfast.zero.GatheredParameters) == load_golden("unmanaged_accumulation")


@pytest.mark.parametrize("stage, precision, offload", [(0, "fp32", False), (1, "fp32", False), (2, "fp32", False),
                                                       (3, "fp32", False), (1, "fp32", True), (2, "fp32", True),
                                                       (3, "fp32", True), (0, "bf16", False), (3, "bf16", False)])
def test_each_step_is_the_boundary_and_matches_torch(stage, precision, offload):
    engine, seen, samples = train(_init, stage, precision, offload)
    tol = 2e-2 if precision == "bf16" else 1e-6
    params = list(engine.module.parameters())
    with dsfast.zero.GatheredParameters(params):
        for a, b in zip(params, reference(world=1)):
            torch.testing.assert_close(a.detach().float(), b, atol=tol, rtol=0)
    assert seen == [False] * sum(COUNTS)
    assert (engine.global_steps, engine.micro_steps) == (len(COUNTS), len(COUNTS))
    assert samples == [MICRO * 1, MICRO * 4, MICRO * 6]


def _engine(stage=0, **extra):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return _init(model=model, model_parameters=model.parameters(), config={**config(stage), **extra})[0], model


def test_set_gradient_accumulation_boundary_is_refused():
    engine, _ = _engine()
    with pytest.raises(RuntimeError, match=r"set_gradient_accumulation_boundary\(\) does not apply with "
                                           r"managed_gradient_accumulation=false"):
        engine.set_gradient_accumulation_boundary(True)


def test_step_inside_no_sync_is_refused():
    engine, _ = _engine(stage=1)
    with engine.no_sync():
        engine.backward(engine(torch.ones(2, 4)).sum())
        with pytest.raises(RuntimeError, match=r"engine.step\(\) inside engine.no_sync\(\)"):
            engine.step()
    engine.step()          # outside the block: the no_sync backward's gradients are reduced and applied
    assert engine.global_steps == 1 and engine.was_step_applied()


@pytest.mark.parametrize("stage", [0, 1])
def test_a_plain_loss_backward_is_still_refused_before_the_reduction(stage):
    engine, model = _engine(stage=stage)
    model(torch.ones(2, 4)).sum().backward()
    with pytest.raises(RuntimeError, match=r"engine.backward\(loss\) instead of loss.backward\(\)"):
        engine.step()
    assert not engine.is_gradient_accumulation_boundary()     # the failed step() left no boundary behind


@pytest.mark.parametrize("stage, overlap, ok", [(0, True, False), (1, True, False), (1, None, True),
                                                (2, True, True), (3, None, True)])
def test_overlap_comm_only_from_stage_2(stage, overlap, ok):
    cfg = config(stage)
    if overlap is not None:
        cfg["zero_optimization"]["overlap_comm"] = overlap
    if ok:
        dsfast.config.load_config(cfg)
        return
    with pytest.raises(dsfast.config.DsConfigError,
                       match=r"managed_gradient_accumulation: false supports zero_optimization.overlap_comm only at "
                             r"ZeRO stage 2 or 3 \(stage is \d\)"):
        dsfast.config.load_config(cfg)


def test_the_default_keeps_the_managed_boundaries():
    cfg = config(0)
    del cfg["managed_gradient_accumulation"]
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    engine = _init(model=model, model_parameters=model.parameters(), config=cfg)[0]
    answers = []
    for _ in range(4):
        answers.append(engine.is_gradient_accumulation_boundary())
        engine.backward(engine(torch.ones(2, 4)).sum())
        engine.step()
    assert answers == [False, True, False, True] and engine.global_steps == 2
