"""deepspeed.utils' setters on 2 gloo ranks (each rank writes only its own piece): what the full and local setters
set is read back by the full getters (collectives) on both ranks, and the next step equals torch's AdamW on the
set values, to 1e-6, at stages 1-3 (the one-rank cases: tests/test_safe_setters.py)."""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402
from worker_safe_setters import CASES  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("setters") / "out.pt"
    launch(os.path.join(HERE, "worker_safe_setters.py"), [out], nprocs=2, timeout=150)
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("case", CASES, ids=[f"s{s}-{p}-{'offload' if o else 'dev'}-{'local' if l else 'full'}"
                                             for s, p, o, l in CASES])
def test_setters_on_two_ranks_are_read_back_and_stepped_from(ranks, case):
    for rank, record in enumerate(ranks):
        for name, read_back, got, want in record[case]:
            assert read_back, f"rank {rank} {name}: a getter did not return what was set"
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5, msg=f"rank {rank} {name}")
