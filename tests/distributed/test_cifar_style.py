"""A DeepSpeed-style CIFAR program (programs/cifar_style.py) run unchanged with `import deepspeed` pointing at
dsfast, on 2 gloo ranks at ZeRO stage 0 in fp32: it trains (the mean loss falls) and both ranks end with the
same weights although each rank initialised its own differently."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from deepspeed_shim import shim_env  # noqa: E402
from dist_launch import launch  # noqa: E402

PROGRAM = os.path.join(HERE, "programs", "cifar_style.py")
EPOCHS = 20   # seeded: the mean loss goes 2.30 -> 0.66 here


def test_cifar_style_program_trains_on_two_ranks_through_the_deepspeed_shim(tmp_path):
    out = tmp_path / "result.json"
    env = {**shim_env(tmp_path / "shim"), "DS_ACCELERATOR": "cpu"}
    outputs = launch(PROGRAM, ["--out", out, "--epochs", EPOCHS, "--dtype", "fp32", "--stage", 0], nprocs=2,
                     timeout=240, extra_env=env)
    result = json.loads(out.read_text())
    log = outputs[0][1]
    assert result["engine_type"].startswith("dsfast"), result      # the shim routed deepspeed to dsfast
    assert (result["world_size"], result["device"], result["backend"]) == (2, "cpu", "gloo"), result
    assert result["steps_per_epoch"] == 64 // 16                   # 64 samples, 16 per step over both ranks
    losses = result["losses"]
    assert len(losses) == EPOCHS and losses[-1] < 0.5 * losses[0], (losses, log)
    assert result["max_weight_diff"] == 0.0 and result["weights_nonzero"], result
