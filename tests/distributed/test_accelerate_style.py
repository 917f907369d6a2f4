"""accelerate's DeepSpeed example shape (programs/accelerate_style.py) on 2 gloo ranks, with `deepspeed` made dsfast
by `dsfast alias install --target` (the metadata accelerate checks). At ZeRO stage 3 its final save calls
model.state_dict() on every rank; DeepSpeed answers ranks > 0 with placeholders, and the run must exit 0 with the
whole weights saved by rank 0. The resumed run must match the uninterrupted one exactly (same stage, same world).
Skipped where transformers and accelerate are not installed (test extras)."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
safetensors_torch = pytest.importorskip("safetensors.torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import REPO, free_port, launch  # noqa: E402

from dsfast.alias_install import install  # noqa: E402

PROGRAM = os.path.join(HERE, "programs", "accelerate_style.py")


@pytest.mark.parametrize("stage", [2, 3])
def test_accelerate_trains_resumes_and_saves_at_stage(tmp_path, stage):
    install(str(tmp_path / "alias"))
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "alias"), REPO]), "DS_ACCELERATOR": "cpu",
           "STAGE": str(stage)}
    results = {}
    for phase in ("full", "resume"):
        outputs = launch(PROGRAM, [tmp_path / "out", phase], nprocs=2, timeout=300, extra_env=env)
        assert all(rc == 0 for rc, _ in outputs)
        line = next(l for l in outputs[0][1].splitlines() if l.startswith("RESULT "))
        results[phase] = json.loads(line[7:])
    full, resume = results["full"], results["resume"]
    assert full["distributed_type"] == "DistributedType.DEEPSPEED" and full["deepspeed"] == "dsfast"
    assert full["engine"].startswith("dsfast"), full
    assert len(full["losses"]) == 8 and resume["losses"] == full["losses"][4:], (full, resume)
    saved = {phase: safetensors_torch.load_file(tmp_path / "out" / f"final-{phase}" / "model.safetensors")
             for phase in ("full", "resume")}
    assert saved["full"]["transformer.wte.weight"].shape == (128, 32)     # whole weights, also at stage 3
    assert set(saved["full"]) == set(saved["resume"])
    assert all(torch.equal(saved["full"][k], saved["resume"][k]) for k in saved["full"])


def test_unmodified_accelerate_launch_use_deepspeed(tmp_path):
    # `accelerate launch --use_deepspeed` imports deepspeed.launcher.runner and starts the ranks itself
    install(str(tmp_path / "alias"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "alias"), REPO]), "DS_ACCELERATOR": "cpu",
           "STAGE": "3", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--use_deepspeed", "--num_processes",
           "2", "--num_machines", "1", "--zero_stage", "3", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), PROGRAM, str(tmp_path / "out"), "full"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    result = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("RESULT "))[7:])
    assert result["engine"].startswith("dsfast") and len(result["losses"]) == 8, result
    saved = safetensors_torch.load_file(tmp_path / "out" / "final-full" / "model.safetensors")
    assert saved["transformer.wte.weight"].shape == (128, 32)
