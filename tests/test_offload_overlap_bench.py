"""benchmarks/offload_overlap.py (issue 28's numbers) keeps working: its --quick smoke runs every row end to end
(no timing asserted), and its refusals name what is wrong."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import offload_overlap as bench  # noqa: E402


def run(*args, timeout=600):
    # a child process: the script pins its threads and sets OMP_NUM_THREADS / the test placement for itself
    return subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "offload_overlap.py"), *args],
                          capture_output=True, text=True, timeout=timeout)


def disk_dir(tmp_path):
    """tmp_path, or a directory under /var/tmp where tmp_path is a tmpfs (the script refuses one: no O_DIRECT)."""
    if bench.fs_type(str(tmp_path)) != "tmpfs":
        return str(tmp_path)
    if bench.fs_type("/var/tmp") == "tmpfs":
        pytest.skip("no directory on a disk: both tmp_path and /var/tmp are tmpfs")
    return tempfile.mkdtemp(prefix="offload-overlap-test-", dir="/var/tmp")


def test_quick_runs_every_row(tmp_path):
    out = tmp_path / "figures.json"
    disk = disk_dir(tmp_path)
    try:
        res = run("--quick", "--nvme-dir", disk, "--json", str(out))
    finally:
        if disk != str(tmp_path):
            shutil.rmtree(disk, ignore_errors=True)
    assert res.returncode == 0, res.stdout + res.stderr
    figures = json.loads(out.read_text())
    rows = figures["rows"]
    wanted = {"floor", "no offload", "offload serial", "nvme serial"}
    wanted |= {"offload overlap"} if figures["overlap_available"]["cpu"] else set()
    wanted |= {"nvme overlap"} if figures["overlap_available"]["nvme"] else set()
    assert set(rows) == wanted
    steps = figures["args"]["warmup"] + figures["args"]["rounds"] * (figures["args"]["block"] + 1)
    for name, r in rows.items():
        assert len(r["ms_per_step"]) == figures["args"]["rounds"], name
        assert len(r["losses"]) == steps, name
    assert all(rd > 0 and wr > 0 for rd, wr in rows["nvme serial"]["io_per_step"])   # the row really swapped
    assert len(rows["nvme serial"]["disk_floor_ratio"]) == figures["args"]["rounds"]
    assert "serial host step" in res.stdout
    for device, row in (("cpu", "offload overlap"), ("nvme", "nvme overlap")):
        if not figures["overlap_available"][device]:
            assert f"{row:<18}overlap: not available ({bench.OVERLAP_KEY}: " in res.stdout


@pytest.mark.parametrize("stage", [1, 3])
@pytest.mark.parametrize("device", ["cpu", "nvme"])
def test_overlap_detection_agrees_with_the_config(stage, device, tmp_path):
    from dsfast.config import DsConfigError, parse_config
    ok, why = bench.overlap_available(stage, device)
    cfg = bench.ds_config(stage, 4, 8, device, overlap=True, nvme_dir=str(tmp_path))
    if ok:
        assert parse_config(cfg).zero_optimization.offload_optimizer.overlap_step is True
    else:
        assert why.startswith(bench.OVERLAP_KEY)
        with pytest.raises(DsConfigError, match="overlap_step"):
            parse_config(cfg)


def test_refusals_name_the_fault(tmp_path):
    res = run("--nvme-dir", "/dev/shm", timeout=120)   # tmpfs: refused before anything runs
    assert res.returncode != 0 and "/dev/shm is tmpfs" in res.stderr
    res = run("--nvme-dir", str(tmp_path / "missing"), timeout=120)
    assert res.returncode != 0 and "missing: no such directory" in res.stderr
    with pytest.raises(SystemExit):
        bench.parse(["--layers", "1"])
    a = bench.parse(["--quick", "--nvme-buffers", "8"])
    with pytest.raises(SystemExit, match="fit its window of 8 buffers"):
        bench.nvme_rows(a, 8, False, str(tmp_path))


def test_a_serial_overlap_mismatch_fails_the_run():
    import torch
    rows = [SimpleNamespace(name="no offload", losses=[1.0, 0.5], engine=object()),
            SimpleNamespace(name="offload serial", losses=[1.0, 0.5], engine=object(),
                            masters=lambda: [torch.ones(2)]),
            SimpleNamespace(name="offload overlap", losses=[1.0, 0.5], engine=object(),
                            masters=lambda: [torch.tensor([1.0, 1.0 + 2 ** -20])])]
    with pytest.raises(SystemExit, match="'offload overlap' is not bitwise 'offload serial'"):
        bench.check_equal(rows)
    rows[2].masters, rows[1].losses = rows[1].masters, [1.0, 0.6]
    with pytest.raises(SystemExit, match="'offload serial' row's losses"):
        bench.check_equal(rows)


def demo_args(**kw):
    args = dict(impl="dsfast", offload="nvme", param_offload="nvme", param_buffers=5, d_model=64, n_layer=2,
                n_head=4, vocab=128, seq=8, overlap_step=True)
    return SimpleNamespace(**{**args, **kw})


def test_the_2_5b_demonstration_takes_overlap_step():
    import nvme_demo
    a = demo_args()
    assert nvme_demo.ds_config(a, "/x")["zero_optimization"]["offload_optimizer"]["overlap_step"] is True
    assert "overlap_step" not in nvme_demo.ds_config(demo_args(overlap_step=False), "/x")["zero_optimization"][
        "offload_optimizer"]
    assert "not with --impl deepspeed" in nvme_demo.overlap_refusal(demo_args(impl="deepspeed"))
    # the states and stage 3's parameters on NVMe are both overlapped (the parameters' window under its lock)
    assert nvme_demo.overlap_refusal(a) == "" and bench.overlap_available(3, "nvme")[0]
    assert nvme_demo.overlap_refusal(demo_args(param_offload="cpu")) == ""
