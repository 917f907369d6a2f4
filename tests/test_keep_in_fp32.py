"""data_types.keep_in_fp32_modules as DeepSpeed 0.19.8 (runtime/keep_in_fp32.py) defines it: the floating buffers a
model names in `_keep_in_fp32_modules_strict` (fp16 and bf16) or `_keep_in_fp32_modules` (fp16 only) stay fp32 with
their exact values, under zero.Init and through initialize()'s cast; a list of patterns replaces the model's names,
[] keeps nothing; parameters follow the training dtype. The router bias values are 0.003 apart near 10, where bf16
is 0.0625 apart: cast, the 8 values would collapse to 1."""
import pytest
import torch

import dsfast
from dsfast.config import DsConfigError

BIAS = 10 + torch.arange(8, dtype=torch.float32) * 0.003


class Router(torch.nn.Module):
    _keep_in_fp32_modules_strict = ["e_score_correction_bias"]
    _keep_in_fp32_modules = ["loose"]

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(4, 8)
        made = BIAS.to(torch.get_default_dtype())   # as a model builds them: in the default dtype
        self.register_buffer("e_score_correction_bias", made.clone())
        self.register_buffer("loose", made.clone())
        self.register_buffer("other", made.clone())

    def forward(self, x):
        return self.gate(x) + (self.e_score_correction_bias + self.loose + self.other).to(x.dtype)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = Router()
        self.register_buffer("e_score_correction_bias", BIAS.clone())   # not under the router: not named by it

    def forward(self, x):
        return self.router(x)


def _config(precision="bf16", stage=0, **data_types):
    cfg = {"train_micro_batch_size_per_gpu": 1, precision: {"enabled": True}, "zero_optimization": {"stage": stage}}
    if data_types:
        cfg["data_types"] = data_types
    return cfg


def _train(cfg, zero_init=False):
    if zero_init:
        with dsfast.zero.Init(config_dict_or_path=cfg):
            model = Model()
    else:
        model = Model()
    engine = dsfast.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=cfg,
                               dist_init_required=False)[0]
    engine.backward(engine(torch.randn(2, 4)).float().sum())
    engine.step()
    return model


def _fp32_exact(buf):
    return buf.dtype == torch.float32 and torch.equal(buf, BIAS)


@pytest.mark.parametrize("stage, zero_init", [(0, False), (2, False), (3, False), (3, True)])
def test_the_strict_list_stays_fp32_under_bf16(stage, zero_init):
    model = _train(_config("bf16", stage), zero_init)
    assert _fp32_exact(model.router.e_score_correction_bias)
    assert model.router.loose.dtype == torch.bfloat16          # the non-strict list is fp16's only
    assert model.router.other.dtype == torch.bfloat16
    assert model.e_score_correction_bias.dtype == torch.bfloat16   # the router's names are matched under it
    assert model.router.gate.weight.dtype == torch.bfloat16        # parameters follow the training dtype


def test_both_lists_stay_fp32_under_fp16():
    model = _train(_config("fp16", 0))
    assert _fp32_exact(model.router.e_score_correction_bias) and _fp32_exact(model.router.loose)
    assert model.router.other.dtype == torch.float16


def test_a_list_of_patterns_replaces_the_models_names_and_empty_keeps_nothing():
    model = _train(_config("bf16", 0, keep_in_fp32_modules=["router.oth*"]))
    assert _fp32_exact(model.router.other)
    assert model.router.e_score_correction_bias.dtype == torch.bfloat16
    model = _train(_config("bf16", 3, keep_in_fp32_modules=[]), zero_init=True)
    assert all(b.dtype == torch.bfloat16 for b in model.buffers())


def test_fp32_training_leaves_everything_as_it_is():
    model = _train({"train_micro_batch_size_per_gpu": 1})
    assert all(b.dtype == torch.float32 for b in model.buffers())


def test_a_16_bit_buffer_built_under_zero_init_is_fp32_before_a_checkpoint_fills_it():
    # transformers builds under a 16-bit default dtype, then copies the checkpoint into the buffers
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with dsfast.zero.Init(config_dict_or_path=_config("bf16", 3)):
            model = Model()
    finally:
        torch.set_default_dtype(old)
    assert model.router.e_score_correction_bias.dtype == torch.float32
    assert model.router.other.dtype == torch.bfloat16


@pytest.mark.parametrize("bad", ["none", [1, 2], {"router": True}])
def test_a_bad_setting_is_refused_by_name(bad):
    with pytest.raises(DsConfigError, match=r"data_types\.keep_in_fp32_modules: .*\"auto\".*list of buffer name"):
        _train(_config("bf16", 0, keep_in_fp32_modules=bad))
    with pytest.raises(DsConfigError, match=r"data_types\.keep_in_fp32_modules"):
        dsfast.zero.Init(config_dict_or_path=_config("bf16", 3, keep_in_fp32_modules=bad))
