"""init_distributed from Open MPI / Slurm variables alone (no RANK/WORLD_SIZE), on real gloo ranks."""
import json
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402


@pytest.mark.parametrize("style,nprocs", [("openmpi", 2), ("slurm", 3)])
def test_start_from_scheduler_variables_and_batch_error_names_world_size(style, nprocs):
    results = launch(os.path.join(HERE, "worker_env.py"), nprocs=nprocs, timeout=90, env_style=style)
    seen = []
    for rc, out in results:
        line = next(line for line in out.splitlines() if line.startswith("RESULT "))
        r = json.loads(line[len("RESULT "):])
        assert (r["backend"], r["world"], r["sum"]) == ("gloo", nprocs, nprocs * (nprocs + 1) / 2)
        assert r["env_rank"] == str(r["rank"])  # exported for user code
        assert r["error"].startswith("DsConfigError") and f"detected world size={nprocs}" in r["error"]
        assert "train_batch_size=5, train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1" in r["error"]
        seen.append(r["rank"])
    assert sorted(seen) == list(range(nprocs))
