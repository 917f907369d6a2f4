"""`python -m dsfast.report`: the machine, the toolchain and every op's state, building nothing."""
import json
import os
import subprocess
import sys

import torch

import dsfast
from dsfast.ops.registry import OPS

STATES = ("prebuilt", "cached", "buildable", "unavailable", "disabled")


def run_report(tmp_path, *args):
    env = dict(os.environ, DSFAST_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DSFAST_DISABLE_OPS", None)
    out = subprocess.run([sys.executable, "-m", "dsfast.report", *args], env=env, capture_output=True,
                         text=True, timeout=120, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_report_text_names_versions_isa_gpu_and_every_op(tmp_path):
    text = run_report(tmp_path)
    assert f"dsfast                {dsfast.version.__version__}" in text
    assert torch.__version__ in text
    for label in ("c++ compiler", "nvcc", "cpu isa", "torch cpu capability", "gpu visible", "op cache"):
        assert label in text
    assert str(tmp_path / "cache") in text
    gpu_line = next(ln for ln in text.splitlines() if ln.startswith("gpu visible"))
    assert gpu_line.split()[2].startswith("yes" if torch.cuda.is_available() else "no")
    op_lines = text.split("\nops:\n", 1)[1].splitlines()
    for name in OPS:
        line = next(ln for ln in op_lines if ln.split()[0] == name)
        assert line.split()[1] in STATES
    assert not (tmp_path / "cache").exists()         # the report built nothing


def test_report_json_states_and_isa(tmp_path):
    info = json.loads(run_report(tmp_path, "--json"))
    assert info["torch"]["version"] == torch.__version__
    assert info["gpu"]["visible"] == torch.cuda.is_available()
    with open("/proc/cpuinfo") as f:
        flags = next(ln for ln in f if ln.startswith("flags")).split(":", 1)[1].split()
    assert info["cpu"]["isa"] == [x for x in info["cpu"]["isa"] if x in flags]
    assert ("avx2" in info["cpu"]["isa"]) == ("avx2" in flags)
    assert set(info["ops"]) == set(OPS)
    for name, op in info["ops"].items():
        assert op["state"] in STATES, (name, op)
        assert op["detail"]
        if op["state"] == "unavailable":
            assert op["detail"]                       # the reason is given
        # An empty cache: nothing can be "cached".
        assert op["state"] != "cached"
    cuda_ops = [op for op in info["ops"].values() if op["cuda"]]
    if torch.version.cuda is None:
        for op in cuda_ops:
            assert op["state"] == "unavailable" and "no CUDA torch" in op["detail"]
    assert not (tmp_path / "cache").exists()


def test_report_says_which_abi_each_torch_library_op_is_built_for(monkeypatch):
    from dsfast.ops import abi
    from dsfast.report import collect, format_report
    info = collect()
    assert info["ops"]["cpu_optim"]["abi"] == abi.choose()
    assert f"[{abi.choose()} ABI]" in format_report(info)
    monkeypatch.setenv("DSFAST_OP_ABI", "classic")
    assert collect()["ops"]["cpu_optim"]["abi"] == "classic"
