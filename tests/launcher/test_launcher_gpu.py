"""On a GPU machine: the launcher finds the GPUs torch sees (without importing torch) and each rank gets its own."""
import json
import os
import subprocess
import sys

import pytest

from launcher_util import free_port, run

pytestmark = pytest.mark.gpu

WORKER = r'''
import os, json, torch
lr = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(lr)
p = torch.cuda.get_device_properties(lr)
print("GPU " + json.dumps({"rank": int(os.environ["RANK"]), "count": torch.cuda.device_count(),
                           "uuid": str(p.uuid), "cvd": os.environ["CUDA_VISIBLE_DEVICES"]}), flush=True)
'''


def gpu_lines(out):
    return [json.loads(line.split("GPU ", 1)[1]) for line in out.splitlines() if "GPU {" in line]


def test_launcher_counts_the_gpus_torch_sees(tmp_path):
    import torch
    n = torch.cuda.device_count()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    p = subprocess.run([sys.executable, "-m", "dsfast.launcher", "--dry_run", "t.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["hosts"] == {"localhost": list(range(n))}


def test_each_rank_gets_its_own_device(tmp_path):
    import torch
    n = min(torch.cuda.device_count(), 2)
    (tmp_path / "g.py").write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "--num_gpus", str(n), "--master_port",
                        str(free_port()), "g.py"], tmp_path, env=env, timeout=120)
    assert rc == 0, err
    recs = gpu_lines(out)
    assert sorted(r["rank"] for r in recs) == list(range(n))
    assert len({r["uuid"] for r in recs}) == n  # distinct physical devices
    assert all(r["cvd"] == ",".join(map(str, range(n))) for r in recs)
    # CUDA_VISIBLE_DEVICES is honoured: with only the last GPU visible, one rank runs on that GPU
    last = torch.cuda.device_count() - 1
    want = str(torch.cuda.get_device_properties(last).uuid)
    rc, out, err = run([sys.executable, "-m", "dsfast.launcher", "--master_port", str(free_port()), "g.py"],
                       tmp_path, env=dict(env, CUDA_VISIBLE_DEVICES=str(last)), timeout=120)
    assert rc == 0, err
    (rec,) = gpu_lines(out)
    assert rec["count"] == 1 and rec["uuid"] == want and rec["cvd"] == str(last)
