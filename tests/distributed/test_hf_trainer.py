"""Hugging Face's Trainer with `deepspeed=ds_config` and `deepspeed` pointing at dsfast (a shim package with
DeepSpeed's distribution metadata, as accelerate checks it): on 2 gloo ranks at ZeRO stages 2 and 3, a run resumed
from its step-4 checkpoint ends with exactly the weights of the uninterrupted run, and the saved model holds the
whole weights. Skipped where transformers and accelerate are not installed (they are not dependencies)."""
import json
import os
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
safetensors_torch = pytest.importorskip("safetensors.torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import REPO, launch  # noqa: E402

PROGRAM = os.path.join(HERE, "programs", "hf_trainer_style.py")


def _shim(directory):
    """A `deepspeed` package that is dsfast, with the dist-info accelerate's is_deepspeed_available() looks for."""
    os.makedirs(directory / "deepspeed", exist_ok=True)
    (directory / "deepspeed" / "__init__.py").write_text("import sys\nimport dsfast\nsys.modules[__name__] = dsfast\n")
    info = directory / "deepspeed-0.19.8.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n")
    return {"PYTHONPATH": os.pathsep.join([str(directory), REPO]), "DS_ACCELERATOR": "cpu"}


@pytest.mark.parametrize("stage", [2, 3])
def test_a_resumed_trainer_run_ends_with_the_uninterrupted_run_s_weights(tmp_path, stage):
    env = {**_shim(tmp_path / "shim"), "STAGE": str(stage)}
    results = {}
    for phase in ("full", "resume"):
        outputs = launch(PROGRAM, [tmp_path / "out", phase], nprocs=2, timeout=300, extra_env=env)
        line = next(l for l in outputs[0][1].splitlines() if l.startswith("RESULT "))
        results[phase] = json.loads(line[7:])
    assert results["full"]["deepspeed"] == "dsfast" and results["full"]["engine"].startswith("dsfast")
    assert len(results["full"]["losses"]) == 8 and results["resume"]["losses"] == results["full"]["losses"]
    full = safetensors_torch.load_file(tmp_path / "out" / "final-full" / "model.safetensors")
    resumed = safetensors_torch.load_file(tmp_path / "out" / "final-resume" / "model.safetensors")
    assert full["transformer.wte.weight"].shape == (128, 32)     # whole weights, also at stage 3
    assert set(full) == set(resumed) and all(torch.equal(full[k], resumed[k]) for k in full)
