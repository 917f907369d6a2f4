"""The clip coefficient in DeepSpeed 0.19.8's own arithmetic (zero/step/clip_arith.py), so that a clipped run is
bit-identical to DeepSpeed's.

Compared with DeepSpeed's recorded runs (tests/data/deepspeed_clipping.json, tests/_deepspeed_cases.py CLIP_CASES:
fp32, client torch Adam, one rank, stages 0-3, clip 1.0 with one param group and 0.3 with two): every step's loss
and a sha256 of every parameter's bytes must be equal (tolerance: none, bit for bit), and so must the global norm
where DeepSpeed reports one (its stage 0 in fp32 reports None; dsfast reports the norm it clipped with). Bit for bit
needs the CPU kernels' vector width of the recording (torch's reductions sum in its lanes); on another, the losses
are compared to 1e-5 and the test says so by skipping the rest. Two ranks: tests/distributed/test_clip_deepspeed_dp.py.
Where DeepSpeed's fp32 sums overflow on a finite gradient, the float64 decision still clips (never skips).
"""
import math

import pytest
import torch

import dsfast
from _deepspeed_cases import CLIP_CASES, clip_case_id, clip_trace, compare_bitwise, load_golden
from dsfast.zero.step import clip_arith
from dsfast.zero.step.decide import decide


def _init(**kw):
    return dsfast.initialize(dist_init_required=False, **kw)


@pytest.mark.parametrize("case", CLIP_CASES, ids=[clip_case_id(*c) for c in CLIP_CASES])
def test_a_clipped_run_is_bit_identical_to_deepspeed_0_19_8(case):
    golden = load_golden("clipping")
    want = golden["1 rank"][clip_case_id(*case)]
    got = clip_trace(_init, dsfast.zero.GatheredParameters, *case)
    assert all(n is not None and n > 1.0 for n in got["norm"])   # every step clipped (the case is meaningful)
    compare_bitwise(got, want, golden["cpu_capability"])


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_finite_gradient_past_fp32_sums_still_clips(stage):
    # bf16 holds 1e22; its square overflows DeepSpeed's fp32 sums (stages 0-2), so the float64 decision decides
    big = torch.tensor([1e22, 3.0], dtype=torch.bfloat16)
    small = torch.tensor([4.0])
    pieces = [(0, big), (0, small)]
    d = decide([big, small], factor=1.0, clip=1.0, check_overflow=True, pieces=pieces, stage=stage)
    want = math.sqrt(float(big[0]) ** 2 + 9.0 + 16.0)
    assert d.applied()
    assert float(d.norm) == pytest.approx(want, rel=1e-6)
    assert float(d.clip_coef) == pytest.approx(1.0 / want, rel=1e-6)


def test_stage_0_and_stages_1_to_3_round_the_coefficient_each_their_way():
    # DeepSpeed's stage 0 computes max_norm / (norm + 1e-6), stages 1-3 1 / ((norm + 1e-6) / max_norm): with
    # max_norm 0.3 the two differ in the last bit for this gradient, and each stage must give its own
    g = torch.tensor([2.0, 1.0])
    coef = {s: decide([g], 1.0, 0.3, False, pieces=[(0, g)], stage=s).clip_coef for s in (0, 1, 3)}
    n = torch.tensor(5.0).sqrt() + 1e-6
    assert coef[0] == torch.min(torch.tensor(1.0), torch.tensor(0.3) / n)
    assert coef[1] == 1.0 / torch.clamp(n / 0.3, min=1.0)
    assert float(coef[3]) == pytest.approx(float(coef[1]), rel=1e-6)   # float64 there: same up to rounding
    assert coef[0] != coef[1]


@pytest.mark.parametrize("n", [1, 37, 4096, 70_001, 300_000])
def test_the_cpu_float64_norm_is_deepspeeds_bit_for_bit(n):
    g = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 7
    for t in (g, g.bfloat16(), g[: n // 2 + 1]):
        assert torch.equal(clip_arith._cpu_float64_norm(t), torch.linalg.vector_norm(t.double(), 2.0))


def test_a_large_cpu_run_takes_fp32_norms_and_still_clips_right(monkeypatch):
    # above EXACT_CPU_TOTAL DeepSpeed's float64 norms would cost 4-8x the pass on a CPU: fp32 accumulation there
    g = [torch.randn(1000, generator=torch.Generator().manual_seed(i)) * 3 for i in range(3)]
    pieces = [(0, t) for t in g]
    exact = decide(g, 1.0, 1.0, False, pieces=pieces, stage=2)
    monkeypatch.setattr(clip_arith, "EXACT_CPU_TOTAL", 100)
    assert all(n.dtype == torch.float32 for n in clip_arith.piece_norms(pieces, 2))
    fast = decide(g, 1.0, 1.0, False, pieces=pieces, stage=2)
    assert float(fast.norm) == pytest.approx(float(exact.norm), rel=1e-6)
    assert float(fast.clip_coef) == pytest.approx(float(exact.clip_coef), rel=1e-6)
