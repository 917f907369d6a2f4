"""The placement policy (zero/policy/placement.py) and the CPU test placement that runs every offload copy on CPU ranks.

With DSFAST_TEST_PLACEMENT=distinct-host the host is memory apart from the device even on CPU ranks, so an
offloaded owner really keeps separate masters, copies gradient shards to the host and 16-bit values back, as it
does with a GPU. Those copies move values without changing them: training must be bitwise what the ordinary CPU
placement gives, and the buffers must really be distinct.
"""
import pytest
import torch

import dsfast
from dsfast.config import load_config
from dsfast.zero.policy.placement import TEST_PLACEMENT_ENV, placement_of


def _zero(offload_opt, offload_param=False):
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    if offload_opt:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload_param:
        cfg["zero_optimization"]["offload_param"] = {"device": "cpu"}
    return load_config(config=cfg, world_size=1).zero_optimization


def test_cpu_placement_is_one_memory_and_the_test_placement_two(monkeypatch):
    monkeypatch.delenv(TEST_PLACEMENT_ENV, raising=False)
    p = placement_of(_zero(True), "cpu")
    assert p.offload_states and not p.distinct and not p.copies_states and not p.pin
    assert p.masters_alias(mixed=False)
    monkeypatch.setenv(TEST_PLACEMENT_ENV, "distinct-host")
    p = placement_of(_zero(True), "cpu")
    assert p.distinct and p.copies_states and not p.pin   # nothing to pin without a GPU
    assert not p.masters_alias(mixed=False)                # fp32 masters on the host, parameters on the device
    assert placement_of(_zero(True, True), "cpu").masters_alias(mixed=False, params_offloaded=True)
    assert not placement_of(_zero(False), "cpu").copies_states


def test_an_unknown_test_placement_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(TEST_PLACEMENT_ENV, "gpu-please")
    with pytest.raises(ValueError, match=f"{TEST_PLACEMENT_ENV}='gpu-please'.*distinct-host"):
        placement_of(_zero(True), "cpu")


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))


def _train(stage, precision, offload_param=False, gas=2, steps=4):
    model = _model()
    zero = {"stage": stage, "offload_optimizer": {"device": "cpu"}}
    if offload_param:
        zero["offload_param"] = {"device": "cpu"}
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": gas, "steps_per_print": 1000,
           "gradient_clipping": 0.1, "zero_optimization": zero,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                               dist_init_required=False)[0]
    g = torch.Generator().manual_seed(1)
    for _ in range(steps * gas):
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
        engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
        engine.step()
    from dsfast.utils import safe_get_full_fp32_param
    return engine, [safe_get_full_fp32_param(p).clone() for p in engine.module.parameters()]


def _storage(t):
    return t.untyped_storage().data_ptr()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage,offload_param", [(1, False), (2, False), (3, False), (3, True)])
def test_distinct_host_trains_bitwise_as_the_cpu_placement(monkeypatch, stage, offload_param, precision):
    monkeypatch.delenv(TEST_PLACEMENT_ENV, raising=False)
    _, want = _train(stage, precision, offload_param)
    monkeypatch.setenv(TEST_PLACEMENT_ENV, "distinct-host")
    engine, got = _train(stage, precision, offload_param)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    # internals on purpose: this test checks where the placement put each copy (host or device, apart or shared),
    # which no protocol member exposes
    owner = engine.state_owner
    store = owner.store
    # the copies were real: gradient shards read by the update are host buffers apart from the reduced ones
    update, reduced = owner.update_grads(), owner.grad_shards()
    assert len(update) == len(reduced) and all(_storage(u) != _storage(r) for u, r in zip(update, reduced))
    if precision == "fp32" and not offload_param:   # masters on the host, the parameters on the device
        params = {_storage(t) for t in store.flats}
        assert all(_storage(m) not in params for m in store.masters)
    if precision == "bf16" and not offload_param:   # the CPU optimizer wrote 16-bit values into host copies
        assert all(h is not None for h in store.host16)
    if offload_param:   # the 16-bit shards live on the host: written directly, nothing to copy back
        assert all(h is None for h in store.host16)
    assert engine.memory_breakdown()["comm_buffers"]   # the host copies are counted


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_skipped_fp16_step_copies_nothing_back_from_the_host(monkeypatch, stage):
    # fp16 overflows in its first steps (scale 2^16): the host copies the CPU optimizer did not write must not
    # reach the parameters (they did, as uninitialised memory, before this was tested)
    def run():
        model = _model()
        cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000, "gradient_clipping": 0.1,
               "zero_optimization": {"stage": stage, "offload_optimizer": {"device": "cpu"}},
               "fp16": {"enabled": True, "initial_scale_power": 8},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}}
        engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                                   dist_init_required=False)[0]
        g = torch.Generator().manual_seed(1)
        for step in range(4):
            x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss * float("inf") if step == 0 else loss)
            engine.step()
        from dsfast.utils import safe_get_full_fp32_param
        return engine, [safe_get_full_fp32_param(p).clone() for p in engine.module.parameters()] + \
            [p.detach().float().clone() for p in engine.module.parameters() if p.numel()]
    monkeypatch.delenv(TEST_PLACEMENT_ENV, raising=False)
    _, want = run()
    monkeypatch.setenv(TEST_PLACEMENT_ENV, "distinct-host")
    engine, got = run()
    assert engine.skipped_steps == 1
    for a, b in zip(got, want):
        assert torch.isfinite(a).all() and torch.equal(a, b)
