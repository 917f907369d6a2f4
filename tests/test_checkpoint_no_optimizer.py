"""load_checkpoint into an engine built without an optimizer (evaluation, a reference model; Lightning's
trainer.test(ckpt_path=...)) loads the trained weights at every ZeRO stage and precision.

Before: its stale fp32 masters were copied over the module just loaded (the weights stayed the initial ones), and
with no trainable parameters in bf16 the copy failed on empty lists. Exact: the loaded module must equal the saved
one bit for bit, and the engine's masters (safe_get_full_fp32_param) must follow it."""
import argparse
import warnings

import pytest
import torch

import dsfast
from dsfast.utils import safe_get_full_fp32_param


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def _config(stage, precision, optimizer=True):
    cfg = {"train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000, "zero_optimization": {"stage": stage}}
    if optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 5e-2}}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    elif precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def _trained_and_saved(tmp_path, stage, precision):
    engine, *_ = dsfast.initialize(model=_model(), config=_config(stage, precision), dist_init_required=False)
    for i in range(3):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(2, 8, generator=g), torch.randn(2, 4, generator=g)
        engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
        engine.step()
    engine.save_checkpoint(str(tmp_path))
    return _weights(engine)


def _weights(engine):
    """The module's whole weights (gathered at stage 3), in the model dtype."""
    params = list(engine.module.parameters())
    with dsfast.zero.GatheredParameters(params):
        return [p.detach().clone() for p in params]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_an_engine_without_optimizer_loads_the_trained_weights(tmp_path, stage, precision):
    saved = _trained_and_saved(tmp_path, stage, precision)
    fresh, opt, _, _ = dsfast.initialize(model=_model(), config=_config(stage, precision, optimizer=False),
                                         dist_init_required=False)
    assert opt is None
    initial = _weights(fresh)
    assert any(not torch.equal(a, b) for a, b in zip(initial, saved))      # training moved the weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path, _ = fresh.load_checkpoint(str(tmp_path))
    assert path is not None
    for got, want in zip(_weights(fresh), saved):
        assert torch.equal(got, want)
    for p, want in zip(fresh.module.parameters(), saved):      # the masters follow the loaded module
        assert torch.equal(safe_get_full_fp32_param(p), want.float())


@pytest.mark.parametrize("saved_stage", [1, 2])
def test_lightning_s_inference_engine_loads_a_bf16_checkpoint(tmp_path, saved_stage):
    # Lightning's DeepSpeedStrategy builds its test/predict engine from fp16/bf16 only (no zero section below
    # stage 3), with model_parameters=[] and no optimizer, then loads the training checkpoint
    saved = _trained_and_saved(tmp_path, saved_stage, "bf16")
    model = _model()
    engine, opt, _, _ = dsfast.initialize(args=argparse.Namespace(device_rank=0), model=model, optimizer=None,
                                          lr_scheduler=None, model_parameters=[], dist_init_required=False,
                                          config={"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}})
    assert opt is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine.load_checkpoint(str(tmp_path), load_optimizer_states=False, load_lr_scheduler_states=False)
    for got, want in zip(engine.module.parameters(), saved):
        assert torch.equal(got, want)


@pytest.mark.parametrize("stage", [0, 2])
def test_load_module_only_without_optimizer_keeps_the_loaded_weights(tmp_path, stage):
    saved = _trained_and_saved(tmp_path, stage, "bf16")
    fresh, *_ = dsfast.initialize(model=_model(), config=_config(stage, "bf16", optimizer=False),
                                  dist_init_required=False)
    fresh.load_checkpoint(str(tmp_path), load_module_only=True)
    for got, want in zip(fresh.module.parameters(), saved):
        assert torch.equal(got, want)
