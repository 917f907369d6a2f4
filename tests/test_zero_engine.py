"""ZeRO stages 1-2 in one process: the same training as stage 0, the API DeepSpeed users reach for, errors."""
import pytest
import torch

import dsfast
from dsfast.utils import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,
                          safe_get_local_fp32_param)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))


def _cfg(stage, precision="fp32", offload=False, clip=0.1, gas=1, **zero):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "steps_per_print": 1000,
           "gradient_clipping": clip, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
           "zero_optimization": {"stage": stage, **zero}}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return cfg


def _train(cfg, steps=6, model=None):
    model = model or _model()
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _ in range(engine.gradient_accumulation_steps()):
            x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
            engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
            engine.step()
    return engine


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("stage,offload", [(1, False), (1, True), (2, False), (2, True)])
def test_world_of_one_trains_exactly_as_stage0(precision, stage, offload):
    # GAS 2 for fp32 only: 16-bit gradients accumulate in 16 bits at ZeRO stages (as DeepSpeed's), in fp32 at 0
    gas = 2 if precision == "fp32" else 1
    ref = _train(_cfg(0, precision, gas=gas))
    got = _train(_cfg(stage, precision, offload, gas=gas))
    for a, b in zip(got.module.parameters(), ref.module.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert got.get_global_grad_norm() == pytest.approx(ref.get_global_grad_norm(), rel=1e-5)


def test_optimizer_param_groups_are_the_shards_and_lr_changes_apply():
    engine = _train(_cfg(2), steps=1)
    shards = [p for g in engine.optimizer.param_groups for p in g["params"]]
    assert all(s.dim() == 1 and s.dtype == torch.float32 for s in shards)
    before = [p.detach().clone() for p in engine.module.parameters()]
    for g in engine.optimizer.param_groups:
        g["lr"] = 0.0
        g["weight_decay"] = 0.0
    _train_more(engine)
    for a, b in zip(engine.module.parameters(), before):
        assert torch.equal(a, b)   # lr 0 through engine.optimizer.param_groups: nothing moves
    sd = engine.optimizer.state_dict()
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(next(iter(sd["state"].values())))


def _train_more(engine):
    x, y = torch.randn(4, 16), torch.randn(4, 8)
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
    engine.step()


def test_fp32_stage1_keeps_no_second_copy_of_the_weights():
    engine = _train(_cfg(1), steps=1)
    shard = engine.optimizer.param_groups[0]["params"][0]
    storages = {p.untyped_storage().data_ptr() for p in engine.module.parameters()}
    assert shard.untyped_storage().data_ptr() in storages   # the master IS the parameter bucket's slice
    assert engine.memory_breakdown()["masters"] == {}


def test_safe_get_helpers_return_full_tensors():
    engine = _train(_cfg(2, "bf16"), steps=2)
    w = engine.module[0].weight
    full = safe_get_full_fp32_param(w)
    assert full.shape == w.shape and full.dtype == torch.float32
    torch.testing.assert_close(full.to(torch.bfloat16), w.detach())   # the model holds the rounded master
    assert safe_get_full_optimizer_state(w, "exp_avg").shape == w.shape
    assert safe_get_local_fp32_param(w).numel() == w.numel()          # a world of one owns everything
    assert safe_get_full_grad(w).abs().sum() == 0                     # after the step the grads are cleared
    with pytest.raises(KeyError, match="'momentum_buffer' does not exist"):
        safe_get_full_optimizer_state(w, "momentum_buffer")
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    assert safe_get_full_fp32_param(frozen) is None


def test_no_sync_at_stage2_is_refused():
    engine = _train(_cfg(2), steps=0)
    with pytest.raises(RuntimeError, match="no_sync.*ZeRO stage 2"):
        with engine.no_sync():
            pass


def test_a_client_optimizer_that_already_stepped_is_refused():
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    cfg = _cfg(1)
    del cfg["optimizer"]
    with pytest.raises(ValueError, match="already has state"):
        dsfast.initialize(model=model, optimizer=opt, config=cfg, dist_init_required=False)


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_plain_loss_backward_trains_as_engine_backward(stage, precision):
    # DeepSpeed 0.19.8 (#7665): at ZeRO stages loss.backward() does what engine.backward(loss) does
    def run(plain):
        engine = _train(_cfg(stage, precision, gas=2), steps=0)
        g = torch.Generator().manual_seed(1)
        for _ in range(6):
            x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y)
            loss.backward() if plain else engine.backward(loss)
            engine.step()
        return [safe_get_full_fp32_param(p) for p in engine.module.parameters()], engine.global_steps
    (got, steps), (want, want_steps) = run(True), run(False)
    assert steps == want_steps == 3
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_buckets_are_never_larger_than_the_model():
    engine = _train(_cfg(2, reduce_bucket_size=500_000_000), steps=1)
    total = sum(p.numel() for p in engine.module.parameters())
    assert sum(engine.memory_breakdown()["params"].values()) < (total + 64) * 4   # fp32 parameter buckets


def _masters(engine):
    """What the optimizer steps: this rank's fp32 master shards."""
    return [p for g in engine.optimizer.param_groups for p in g["params"]]


def test_rank_local_optimizer_state_dict_round_trip_continues_identically():
    a = _train(_cfg(2, "bf16"), steps=3)
    b = _train(_cfg(2, "bf16"), steps=3)
    sd = a.optimizer.state_dict()
    fresh = _train(_cfg(2, "bf16"), steps=0)
    fresh.optimizer.load_state_dict(sd)
    with torch.no_grad():   # the model weights and masters as `a` has them
        for p, q in zip(_masters(fresh), _masters(a)):
            p.copy_(q)
        fresh.state_owner.after_checkpoint_load()
    for e in (b, fresh):
        torch.manual_seed(5)
        _train_more(e)
    for p, q in zip(fresh.module.parameters(), b.module.parameters()):
        assert torch.equal(p, q)


def test_zero_knobs_dsfast_does_not_act_on_are_reported():
    from dsfast.config import load_config
    cfg = load_config(config={"train_batch_size": 2, "zero_optimization": {
        "stage": 3, "prefetch_bucket_size": 5, "max_live_parameters": 7, "allgather_bucket_size": 100}},
        world_size=1)
    notes = "\n".join(cfg.ignored_settings())
    assert "zero_optimization.allgather_bucket_size is ignored" in notes
    for key in ("prefetch_bucket_size", "max_live_parameters"):      # stage 3's prefetcher acts on these
        assert key not in notes


def test_memory_breakdown_config_prints_the_model_states_at_each_progress_line(capsys):
    cfg = _cfg(2)
    cfg.update(memory_breakdown=True, steps_per_print=2)
    _train(cfg, steps=4)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "model states" in ln]
    assert len(lines) == 2 and "host" in lines[0] and "MiB" in lines[0]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_communication_data_type_fp32_reduces_bf16_gradients_in_fp32(stage):
    # DeepSpeed's communication_data_type: a bf16 model's gradients reduced and accumulated in fp32 at ZeRO stages
    # (by default in bf16): with one rank that is exactly what stage 0's fp32 buckets do
    cfg = _cfg(stage, "bf16", gas=2)
    cfg["communication_data_type"] = "fp32"
    got = _train(cfg)
    ref = _train(_cfg(0, "bf16", gas=2))
    default = _train(_cfg(stage, "bf16", gas=2))
    for a, b in zip(got.module.parameters(), ref.module.parameters()):
        torch.testing.assert_close(safe_get_full_fp32_param(a), safe_get_full_fp32_param(b), atol=1e-6, rtol=1e-6)
    assert max(float((safe_get_full_fp32_param(a) - safe_get_full_fp32_param(b)).abs().max())
               for a, b in zip(default.module.parameters(), ref.module.parameters())) > 1e-5   # bf16 reductions differ
    grads = got.memory_breakdown()["grads"]
    numel = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in got.module.parameters())
    assert sum(grads.values()) >= 4 * numel   # fp32 gradients: 4 bytes per parameter


def test_communication_data_type_must_be_the_models_or_fp32():
    cfg = _cfg(2, "fp16")
    cfg["communication_data_type"] = "bf16"
    with pytest.raises(ValueError, match="communication_data_type='bf16' with a fp16 model at ZeRO stage 2.*'fp32'"):
        _train(cfg, steps=0)
