"""engine.compile() as DeepSpeed 0.19.8's without DeepCompile (dsfast/engine/compile.py): torch.compile of the module
in place, engine.is_compiled, the same numbers as the uncompiled run (bit for bit: the "eager" and "aot_eager"
backends run the same kernels), DeepCompile's arguments and config switches refused by name, its tuning keys noted,
and DeepSpeed <= 0.14.3's compile.enabled / backend / kwargs honoured at initialize."""
import pytest
import torch

import dsfast
from _deepspeed_cases import clip_batch, clip_config, clip_model, params_digest
from dsfast.config import DsConfigError, load_config


def _run(stage, backend=None, extra=None):
    model = clip_model()
    engine = dsfast.initialize(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                               config={**clip_config(stage, 1.0), **(extra or {})}, dist_init_required=False)[0]
    if backend:
        engine.compile(backend=backend)
    losses = []
    for step in range(3):
        x, y = clip_batch(step)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    params = list(engine.module.parameters())
    with dsfast.zero.GatheredParameters(params):
        return engine, losses, params_digest(params)


@pytest.mark.parametrize("stage, backend", [(0, "eager"), (2, "aot_eager")])
def test_compiled_runs_equal_the_uncompiled_run(stage, backend):
    plain, losses, digest = _run(stage)
    assert not plain.is_compiled
    engine, c_losses, c_digest = _run(stage, backend)
    assert engine.is_compiled and engine.module._compiled_call_impl is not None
    assert c_losses == losses and c_digest == digest
    engine.compile(backend="inductor")                 # already compiled: a no-op, as in DeepSpeed
    assert engine.is_compiled


def test_deepcompile_arguments_are_refused():
    engine, _, _ = _run(0)
    with pytest.raises(ValueError, match=r"schedule=.*DeepCompile"):
        engine.compile(backend="eager", schedule=[(0, [])])
    with pytest.raises(NotImplementedError, match="compiled_autograd_enabled=True"):
        engine.compile(backend="eager", compiled_autograd_enabled=True)
    assert not engine.is_compiled


def test_legacy_compile_section_compiles_at_initialize():
    engine, losses, digest = _run(0, extra={"compile": {"enabled": True, "backend": "eager"}})
    assert engine.is_compiled
    assert (losses, digest) == _run(0)[1:]


@pytest.mark.parametrize("key, value", [("deepcompile", True), ("autoep_non_moe", True), ("passes", ["z1"])])
def test_deepcompile_switches_are_refused_by_name(key, value):
    with pytest.raises(DsConfigError, match=rf"compile\.{key}: .*not supported by dsfast|compile\.{key}: .*lacks"):
        load_config({"train_batch_size": 1, "compile": {key: value}})


def test_deepcompile_tuning_keys_are_noted_not_silent():
    cfg = load_config({"train_batch_size": 1, "compile": {"free_activation": True, "double_buffer": True}},
                      log_ignored=False)
    notes = "\n".join(cfg.ignored_settings())
    assert "compile.free_activation tunes DeepCompile, which is off" in notes
    assert "double_buffer" not in notes                # its default: nothing to say
