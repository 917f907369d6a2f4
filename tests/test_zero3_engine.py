"""ZeRO stage 3 in one process: the same training as stage 0, parameters released between uses, the API
DeepSpeed users reach for at stage 3 (GatheredParameters, state_dict, safe_get_*), errors."""
import warnings

import pytest
import torch

import dsfast
from dsfast.utils import safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state
from test_zero_engine import _cfg, _model, _train


def _cfg3(precision="fp32", offload=False, offload_param=False, gas=1, **zero):
    cfg = _cfg(3, precision, offload, gas=gas, param_persistence_threshold=0, **zero)
    if offload_param:
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu", "pin_memory": True}
    return cfg


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("offload,offload_param", [(False, False), (True, False), (False, True), (True, True)])
def test_world_of_one_trains_exactly_as_stage0(precision, offload, offload_param):
    gas = 2 if precision == "fp32" else 1   # 16-bit gradients accumulate in 16 bits at ZeRO stages
    ref = _train(_cfg(0, precision, gas=gas))
    got = _train(_cfg3(precision, offload, offload_param, gas=gas))
    for a, b in zip(got.module.parameters(), ref.module.parameters()):
        want = b.detach().float() if precision == "fp32" else safe_get_full_fp32_param(b)
        torch.testing.assert_close(safe_get_full_fp32_param(a), want, atol=1e-6, rtol=1e-6)
    assert got.get_global_grad_norm() == pytest.approx(ref.get_global_grad_norm(), rel=1e-5)


def test_parameters_are_released_between_steps_and_state_dict_holds_placeholders():
    engine = _train(_cfg3(), steps=2)
    assert all(p.numel() == 0 for p in engine.module.parameters())
    assert not engine.memory_breakdown()["gathered"]
    assert all(v.numel() == 0 for v in engine.module.state_dict().values())   # DeepSpeed's (test_framework_names)
    with dsfast.zero.GatheredParameters(engine.module.parameters()):
        sd = engine.module.state_dict()
        assert engine.memory_breakdown()["gathered"]
    assert sd["0.weight"].shape == (33, 16)
    torch.testing.assert_close(sd["0.weight"], safe_get_full_fp32_param(engine.module[0].weight))
    assert engine.module[0].weight.numel() == 0   # released again after the block


def test_gathered_parameters_modifier_rank_keeps_the_change_in_shard_and_master():
    engine = _train(_cfg3("bf16"), steps=1)
    w = engine.module[2].weight
    with dsfast.zero.GatheredParameters(w, modifier_rank=0):
        w.data.fill_(0.5)
    torch.testing.assert_close(safe_get_full_fp32_param(w), torch.full((8, 33), 0.5))
    with dsfast.zero.GatheredParameters([w]):
        assert torch.equal(w, torch.full((8, 33), 0.5, dtype=torch.bfloat16))
    with pytest.warns(UserWarning, match=r"1 parameter\(s\) of shape \[8, 33\] were changed inside the block; "
                                         r"the change is discarded.*modifier_rank="):
        with dsfast.zero.GatheredParameters([w]):   # modifier_rank=None: changes are dropped, with a warning
            w.data.fill_(2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with dsfast.zero.GatheredParameters([w]):   # reading only: no warning
            assert w.sum().item() == 0.5 * 8 * 33
    torch.testing.assert_close(safe_get_full_fp32_param(w), torch.full((8, 33), 0.5))
    with pytest.raises(ValueError, match=r"modifier_rank must be None or a rank in \[0, 1\); got 3"):
        dsfast.zero.GatheredParameters([w], modifier_rank=3)


def test_eval_forward_under_no_grad_gathers_and_releases_without_gradients():
    engine = _train(_cfg3(), steps=1)
    before = [safe_get_full_fp32_param(p) for p in engine.module.parameters()]
    engine.eval()
    with torch.no_grad():
        out = engine(torch.randn(4, 16))
    assert out.shape == (4, 8)
    assert all(p.numel() == 0 for p in engine.module.parameters())
    assert all(safe_get_full_grad(p).abs().sum() == 0 for p in engine.module.parameters())
    for p, b in zip(engine.module.parameters(), before):
        assert torch.equal(safe_get_full_fp32_param(p), b)


def test_safe_get_helpers_return_full_tensors_at_stage3():
    engine = _train(_cfg3("bf16"), steps=2)
    w = engine.module[0].weight
    full = safe_get_full_fp32_param(w)
    assert full.shape == (33, 16) and full.dtype == torch.float32
    assert safe_get_full_optimizer_state(w, "exp_avg").shape == (33, 16)
    assert safe_get_full_grad(w).abs().sum() == 0   # cleared after the step


def test_persistent_small_parameters_stay_whole():
    engine = _train(_cfg(3, param_persistence_threshold=40), steps=2)
    assert engine.module[0].bias.shape == (33,) and engine.module[2].bias.shape == (8,)
    assert engine.module[0].weight.numel() == 0
    ref = _train(_cfg(0), steps=2)
    torch.testing.assert_close(engine.module[0].bias.detach(), ref.module[0].bias.detach())


def test_no_sync_is_refused_and_plain_backward_trains_at_stage3():
    engine = _train(_cfg3(), steps=0)
    with pytest.raises(RuntimeError, match="no_sync.*ZeRO stage 3"):
        with engine.no_sync():
            pass
    # DeepSpeed 0.19.8: loss.backward() is engine.backward(loss) at stage 3 (hooks on the outputs)
    want = _train(_cfg3(), steps=0)
    x = torch.randn(4, 16)
    engine(x).sum().backward()
    want.backward(want(x).sum())
    engine.step()
    want.step()
    for p, q in zip(engine.module.parameters(), want.module.parameters()):
        torch.testing.assert_close(safe_get_full_fp32_param(p), safe_get_full_fp32_param(q), atol=1e-6, rtol=1e-6)


def test_destroy_gives_back_an_ordinary_module():
    engine = _train(_cfg3(), steps=2)
    want = [safe_get_full_fp32_param(p) for p in engine.module.parameters()]
    engine.destroy()
    for p, w in zip(engine.module.parameters(), want):
        assert torch.equal(p.detach(), w)
    assert engine.module(torch.randn(2, 16)).shape == (2, 8)
    assert "0.weight" in engine.module.state_dict()


def test_reinitializing_the_same_model_repartitions_it():
    model = _model()
    first = _train(_cfg3(), steps=1, model=model)
    want = [safe_get_full_fp32_param(p) for p in model.parameters()]
    second = dsfast.initialize(model=model, model_parameters=model.parameters(), config=_cfg3(),
                               dist_init_required=False)[0]
    assert first.state_owner is not second.state_owner
    for p, w in zip(model.parameters(), want):
        assert torch.equal(safe_get_full_fp32_param(p), w)


def test_model_persistence_threshold_caps_the_total_kept_whole():
    # params in order: 0.weight 528, 0.bias 33, 2.weight 264, 2.bias 8 elements; all under the per-param threshold
    cfg = _cfg(3, param_persistence_threshold=1000, stage3_model_persistence_threshold=600)
    engine = _train(cfg, steps=1)
    kept = [n for n, p in engine.module.named_parameters() if p.ds_persist]
    assert kept == ["0.weight", "0.bias", "2.bias"]      # 528 + 33 + 8 <= 600; 2.weight would pass it
    assert "model_persistence_threshold" not in "\n".join(engine.config.ignored_settings())
    ref = _train(_cfg(0), steps=1)
    for a, b in zip(engine.module.parameters(), ref.module.parameters()):
        torch.testing.assert_close(safe_get_full_fp32_param(a), b.detach(), atol=1e-6, rtol=1e-6)
