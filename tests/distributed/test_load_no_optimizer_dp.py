"""load_checkpoint into an engine without an optimizer on 2 gloo ranks loads the trained weights exactly, at every
ZeRO stage and precision (worker_load_no_optimizer.py; one process: tests/test_checkpoint_no_optimizer.py)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402

RUNS = [f"{stage}:{precision}" for stage in (0, 1, 2, 3) for precision in ("fp32", "bf16", "fp16")]


def test_every_stage_and_precision_loads_the_weights_without_an_optimizer(tmp_path):
    outputs = launch(os.path.join(HERE, "worker_load_no_optimizer.py"), [tmp_path, *RUNS], nprocs=2, timeout=400)
    for rank, (_, text) in enumerate(outputs):
        for run in RUNS:
            assert f"rank {rank}: {run} loaded exactly" in text, text[-3000:]
