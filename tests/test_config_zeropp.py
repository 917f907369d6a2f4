"""The ZeRO++ keys (dsfast/config/zeropp.py), decided by meaning: DeepSpeed 0.19.8 acts on them at stage 3 only.
hpZ over every rank (1, or the world size: one node's ranks on one node) is the same as none and accepted; a smaller
secondary group and any quantization are refused by key name with what would be valid; below stage 3 they are
accepted with a note, as they change nothing there (in DeepSpeed neither). --explain says which."""
import pytest

from dsfast.config import DsConfigError, load_config
from dsfast.config.explain import explain


def z3(world=8, stage=3, **zero):
    return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage, **zero}}


def notes(data, world):
    return "\n".join(load_config(data, world_size=world, log_ignored=False).ignored_settings())


def refused(data, world):
    with pytest.raises(DsConfigError) as info:
        load_config(data, world_size=world, log_ignored=False)
    return str(info.value)


@pytest.mark.parametrize("size, world", [(1, 8), (8, 8), (16, 8), (8, 1)])
def test_hpz_over_every_rank_is_the_same_as_none_and_accepted(size, world):
    data = z3(zero_hpz_partition_size=size)
    cfg = load_config(data, world_size=world, log_ignored=False)
    assert cfg.zero_optimization.zero_hpz_partition_size == size
    if size != 1:
        assert "the same as no secondary partition" in notes(data, world)
        origins = dict((k, o) for k, _, o in explain(data, world_size=world))
        origin = origins["zero_optimization.zero_hpz_partition_size"]
        assert "accepted" in origin and "the same as 1" in origin


def test_hpz_smaller_than_the_world_is_refused_by_name():
    msg = refused(z3(zero_hpz_partition_size=8), world=16)   # open-instruct's 8 on two nodes of 8
    assert "zero_optimization.zero_hpz_partition_size: 8" in msg
    assert "groups of 8 of the 16 ranks" in msg and "set 1 (or 16" in msg


def test_hpz_must_divide_the_world():
    msg = refused(z3(zero_hpz_partition_size=3), world=8)
    assert "zero_optimization.zero_hpz_partition_size: 3 must divide the number of ranks (8)" in msg


@pytest.mark.parametrize("key", ["zero_quantized_weights", "zero_quantized_nontrainable_weights",
                                 "zero_quantized_gradients"])
def test_quantization_is_refused_at_stage_3_by_name(key):
    msg = refused(z3(**{key: True}), world=2)
    assert f"zero_optimization.{key}: true asks for" in msg and "set it to false" in msg
    assert "ZeRO++ off: accepted" in dict((k, o) for k, _, o in explain(z3(), 2))[f"zero_optimization.{key}"]


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_below_stage_3_they_change_nothing_and_say_so(stage):
    data = z3(stage=stage, zero_hpz_partition_size=4, zero_quantized_weights=True, zero_quantized_gradients=True)
    text = notes(data, world=8)
    assert "zero_hpz_partition_size, zero_quantized_weights, zero_quantized_gradients" in text
    assert f"at stage {stage} it changes nothing" in text
    origin = dict((k, o) for k, _, o in explain(data, world_size=8))["zero_optimization.zero_quantized_weights"]
    assert "ZeRO++ acts at stage 3 only" in origin


def test_defaults_say_nothing():
    assert "ZeRO++" not in notes(z3(), world=8) and "secondary" not in notes(z3(), world=8)
