"""Clipped fp32 runs on 2 gloo ranks against DeepSpeed 0.19.8's recorded ones (tests/data/deepspeed_clipping.json,
"2 ranks"; the one-rank comparison and its rules: tests/test_clip_deepspeed.py).

Bit for bit where the arithmetic is the same: stage 0 (each rank clips the all-reduced gradients; DeepSpeed's
average of the norm over 2 ranks is exact) and stage 3's weights (its float64 norm can differ from DeepSpeed's in
the last bit: each parameter is split between the ranks at other points, but the fp32 coefficient rounds alike).
Stages 1-2 are not bitwise on 2 ranks: DeepSpeed cuts each param group's flat gradient into one slice per rank,
dsfast each bucket, so the ranks' fp32 partial sums differ; their losses agree to 1e-5.
"""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from _deepspeed_cases import clip_traces_launched, compare_bitwise, load_golden  # noqa: E402

BITWISE = ["stage 0 clip 1.0 groups 1", "stage 0 clip 0.3 groups 2"]
WEIGHTS_BITWISE = ["stage 3 clip 1.0 groups 1", "stage 3 clip 0.3 groups 2"]
CLOSE = ["stage 2 clip 1.0 groups 1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    golden = load_golden("clipping")
    got = clip_traces_launched("dsfast", 2, tmp_path_factory.mktemp("clip"), BITWISE + WEIGHTS_BITWISE + CLOSE)
    return got, golden["2 ranks"], golden["cpu_capability"]


@pytest.mark.parametrize("case", BITWISE)
def test_stage_0_on_two_ranks_is_bit_identical(runs, case):
    got, want, capability = runs
    compare_bitwise(got[case], want[case], capability)


@pytest.mark.parametrize("case", WEIGHTS_BITWISE)
def test_stage_3_weights_on_two_ranks_are_bit_identical(runs, case):
    got, want, capability = runs
    assert got[case]["norm"] == pytest.approx(want[case]["norm"], rel=1e-12)
    compare_bitwise({**got[case], "norm": want[case]["norm"]}, want[case], capability)


@pytest.mark.parametrize("case", CLOSE)
def test_stages_1_2_on_two_ranks_agree_closely(runs, case):
    got, want, _ = runs
    assert got[case]["loss"] == pytest.approx(want[case]["loss"], rel=1e-5)
    assert got[case]["norm"] == pytest.approx(want[case]["norm"], rel=1e-5)
