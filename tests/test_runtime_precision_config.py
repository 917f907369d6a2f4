"""deepspeed.runtime.precision_config (dsfast/runtime/precision_config.py): DeepSpeed's fp16/bf16 section classes
and readers give the same values and refusals as DeepSpeed 0.19.8's (pydantic ValidationError on bad values)."""
import pytest
from pydantic import ValidationError

from dsfast.runtime import precision_config as pc


def test_readers_and_defaults():
    assert pc.get_bfloat16_config({"bf16": {"enabled": True}}).enabled is True
    assert pc.get_bfloat16_config({"bfloat16": {"enabled": True}}).enabled is True
    assert pc.get_bfloat16_config({"bf16": {"enabled": False}, "bfloat16": {"enabled": True}}).enabled is False
    bf16 = pc.get_bfloat16_config({})
    assert (bf16.enabled, bf16.immediate_grad_update, bf16.check_grad_overflow) == (False, False, True)
    fp16 = pc.get_float16_config({"fp16": {"enabled": True, "loss_scale": 128}})
    assert (fp16.enabled, fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window, fp16.hysteresis,
            fp16.min_loss_scale) == (True, 128.0, 16, 1000, 2, 1.0)
    assert pc.get_float16_config({}).enabled is False


@pytest.mark.parametrize("kwargs", [dict(loss_scale=-1), dict(loss_scale=float("nan")), dict(loss_scale=True),
                                    dict(enabled=True, loss_scale=0, loss_scale_window=0),
                                    dict(enabled=True, loss_scale=0, min_loss_scale=-1),
                                    dict(enabled=True, no_such_key=1)])
def test_fp16_refusals(kwargs):
    with pytest.raises(ValidationError):
        pc.DeepSpeedFP16Config(**kwargs)


def test_fp16_unused_dynamic_settings_accepted():
    assert pc.DeepSpeedFP16Config(enabled=True, loss_scale=128, loss_scale_window=0).loss_scale_window == 0
    assert pc.DeepSpeedFP16Config(loss_scale="3").loss_scale == 3.0


def test_reader_errors():
    with pytest.raises(TypeError, match="ds_config as a dict"):
        pc.get_float16_config(["fp16"])
    with pytest.raises(TypeError, match='"bf16" must be an object'):
        pc.get_bfloat16_config({"bf16": True})


@pytest.mark.parametrize("value", [[], {}, [1.0]])
def test_fp16_loss_scale_container_says_number(value):
    with pytest.raises(ValidationError, match="must be a number, not (a list|an object)"):
        pc.DeepSpeedFP16Config(loss_scale=value)
