"""deepspeed.utils' setters (safe_set_full_* / safe_set_local_*, safe_update_full_grad_vectorized), DeepSpeed
0.19.8's API: what they set is what the getters read back and what the next step uses (torch's AdamW on the set
values, to 1e-6), at every stage, with and without offload; their errors. Two ranks: test_safe_setters_dp.py."""
import os
import sys

import pytest
import torch

import dsfast
from dsfast.utils import (safe_get_full_grad, safe_get_full_fp32_param, safe_get_full_optimizer_state,
                          safe_get_local_grad, safe_set_full_fp32_param,
                          safe_set_full_grad, safe_set_full_optimizer_state, safe_set_local_grad,
                          safe_update_full_grad_vectorized)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "distributed"))
import setters_common as C  # noqa: E402


def _check(results):
    for name, read_back, got, want in results:
        assert read_back, f"{name}: a getter did not return what was set"
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("stage,precision,offload", [(0, "fp32", False), (0, "bf16", False), (1, "fp32", False),
                                                     (1, "bf16", True), (2, "fp32", True), (2, "bf16", False),
                                                     (3, "fp32", False), (3, "bf16", True)])
def test_full_setters_are_read_back_and_stepped_from(stage, precision, offload):
    _check(C.run(stage, precision, offload))


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_local_setters_are_read_back_and_stepped_from(stage):
    _check(C.run(stage, "bf16", False, local=True))


def _engine(stage=2, **extra):
    model = C.model()
    cfg = C.config(stage, "fp32", False)
    cfg.update(extra)
    return dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                             dist_init_required=False)[0]


@pytest.mark.parametrize("stage", [0, 1, 3])
def test_update_full_grad_vectorized_applies_the_function_to_each_full_gradient(stage):
    engine = _engine(stage)
    C._backward(engine, 0)
    params = list(engine.module.parameters())
    before = [safe_get_full_grad(p).clone() for p in params]
    seen = []

    def double_plus_index(old, param):
        seen.append(param)
        return old * 2 + len(seen)
    safe_update_full_grad_vectorized(params, double_plus_index)
    assert seen == params
    for i, (p, old) in enumerate(zip(params, before)):
        assert torch.equal(safe_get_full_grad(p), old * 2 + (i + 1))


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_setters_refuse_a_value_of_the_wrong_size_or_kind(stage):
    engine = _engine(stage)
    C._backward(engine, 0)
    w = engine.module[0].weight   # (33, 16)
    with pytest.raises(ValueError, match=r"safe_set_full_fp32_param: value has 16 elements .* parameter of shape "
                                         r"\(33, 16\) has 528"):
        safe_set_full_fp32_param(w, torch.zeros(16))
    with pytest.raises(ValueError, match="safe_set_local_grad: value has 3 elements"):
        safe_set_local_grad(w, torch.zeros(3))
    with pytest.raises(TypeError, match="safe_set_full_grad: value must be a torch.Tensor, got list"):
        safe_set_full_grad(w, [0.0] * 528)
    with pytest.raises(TypeError, match="floating-point tensor, got torch.int64"):
        safe_set_full_grad(w, torch.zeros(33, 16, dtype=torch.long))
    with pytest.raises(KeyError, match="'exp_avg' does not exist .* after the first optimizer step"):
        safe_set_full_optimizer_state(w, torch.zeros(33, 16), "exp_avg")   # no step yet
    engine.step()
    with pytest.raises(KeyError, match="'momentum_buffer' does not exist .* available keys .*exp_avg"):
        safe_set_full_optimizer_state(w, torch.zeros(33, 16), "momentum_buffer")


def test_a_parameter_no_engine_trains_is_left_alone_with_a_warning(caplog):
    model = C.model()
    model[0].weight.requires_grad_(False)
    dsfast.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                      config=C.config(2, "fp32", False), dist_init_required=False)
    before = model[0].weight.detach().clone()
    safe_set_full_fp32_param(model[0].weight, torch.ones(33, 16))
    assert torch.equal(model[0].weight, before)
    assert safe_get_full_fp32_param(model[0].weight) is None
    assert "is not trained by any engine" in caplog.text


def test_an_8bit_moment_is_set_through_its_blocks():
    """8-bit moments (state_precision int8) are written by re-quantizing the blocks the parameter touches: zeros
    read back as zeros exactly (code 0); a wrong shape is still refused (tests/test_engine_8bit_states.py has the
    values' bound)."""
    cfg = C.config(2, "fp32", True)
    cfg["zero_optimization"]["offload_optimizer"]["state_precision"] = "int8"
    model = C.model()
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    C._backward(engine, 0)
    engine.step()
    assert safe_get_full_optimizer_state(model[0].weight, "exp_avg").abs().sum() > 0
    safe_set_full_optimizer_state(model[0].weight, torch.zeros(33, 16), "exp_avg")
    assert torch.equal(safe_get_full_optimizer_state(model[0].weight, "exp_avg"), torch.zeros(33, 16))
    with pytest.raises(ValueError, match="safe_set_full_optimizer_state"):
        safe_set_full_optimizer_state(model[0].weight, torch.zeros(7), "exp_avg")


@pytest.mark.parametrize("stage", [1, 3])
def test_the_step_clips_by_the_norm_of_the_gradients_set_locally(stage):
    # DeepSpeed's test_zero_grad_clip shape: clamp each local gradient, then the step's global norm is theirs
    cfg = C.config(stage, "bf16", True)
    cfg["gradient_clipping"] = 1.0
    model = C.model()
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    C._backward(engine, 0)
    clamped = []
    for p in engine.module.parameters():
        g = torch.clamp(safe_get_local_grad(p).float(), -0.05, 0.05)
        safe_set_local_grad(p, g)
        held = safe_get_local_grad(p).float()   # as the gradients are held (bf16 here: 0.05 is rounded)
        torch.testing.assert_close(held, g, atol=2e-4, rtol=0)
        clamped.append(held.flatten())
    engine.step()
    want = torch.linalg.vector_norm(torch.cat(clamped)).item()
    assert engine.get_global_grad_norm() == pytest.approx(want, rel=1e-5)


def test_at_stage3_fp32_a_persistent_parameter_takes_the_set_value_at_once():
    # the shard is the fp32 master; a parameter kept whole (under param_persistence_threshold) must not go stale
    cfg = C.config(3, "fp32", False)
    cfg["zero_optimization"]["param_persistence_threshold"] = 10 ** 6
    model = C.model()
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    bias = engine.module[2].bias
    assert bias.ds_status.name == "AVAILABLE"
    safe_set_full_fp32_param(bias, torch.arange(8.0))
    assert torch.equal(bias.data, torch.arange(8.0))
    assert torch.equal(safe_get_full_fp32_param(bias), torch.arange(8.0))
