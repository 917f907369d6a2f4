"""managed_gradient_accumulation=false on 2 gloo ranks, as DeepSpeed 0.19.8 implements it: each step() is the
boundary, after however many backwards the caller chose; stages 0-1 reduce in step(), stages 2-3 in each backward.
The weights must equal plain PyTorch on the global micro-batches (fp32: atol 1e-6; bf16: the bf16 rounding of the
same, atol 2e-2)."""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402
from dp_common import MICRO  # noqa: E402
from unmanaged_common import COUNTS, reference  # noqa: E402

RUNS = ["0:fp32:0", "1:fp32:0", "2:fp32:0", "3:fp32:0", "1:fp32:1", "2:fp32:1", "3:fp32:1", "2:bf16:0"]


def test_unmanaged_accumulation_matches_torch_at_every_stage_on_two_ranks(tmp_path):
    out = tmp_path / "out.pt"
    launch(os.path.join(HERE, "worker_unmanaged.py"), [out, *RUNS], nprocs=2, timeout=300)
    results = torch.load(out)
    want = reference(world=2)
    for run in RUNS:
        got = results[run]
        tol = 2e-2 if "bf16" in run else 1e-6
        for a, b in zip(got["weights"], want):
            torch.testing.assert_close(a, b, atol=tol, rtol=0, msg=run)
        assert got["seen"] == [False] * sum(COUNTS), run      # the boundary is only inside step()
        assert got["global_steps"] == got["micro_steps"] == len(COUNTS), run
        # as DeepSpeed counts: the micro-batches actually accumulated (MICRO x 2 ranks each)
        assert got["samples"] == [MICRO * 2 * 1, MICRO * 2 * 4, MICRO * 2 * 6], run
