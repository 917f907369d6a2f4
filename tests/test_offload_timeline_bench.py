"""benchmarks/offload_timeline.py (gpu_check.sh's `overlap` stage): its lane recorder stamps every lane item with
its lane's name and kind and leaves the lane classes as they were; its interval arithmetic; the --cpu-standin smoke
end to end, and the clean skip without a GPU."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import offload_timeline as tl  # noqa: E402
from dsfast.accelerator import streams  # noqa: E402


def test_the_recorder_stamps_lane_items_and_uninstalls():
    before = (streams.Lanes.device_lane, streams.Lanes.host_lane, streams.ThreadLane.submit)
    rec = tl.LaneRecorder()
    rec.install()
    try:
        lanes = streams.Lanes("cpu", emulate=True)
        out = []
        copy = lanes.device_lane("d2h").submit(lambda: (time.sleep(0.01), out.append("copy")), "copy of unit 0")
        step = lanes.host_lane("step").submit(lambda: out.append("step"), "step of unit 0")
        copy.wait()
        step.wait()
        lanes.close()
    finally:
        rec.uninstall()
    assert sorted(out) == ["copy", "step"]   # the wrapped items still ran
    assert rec.kinds == {"d2h": "device", "step": "host"}
    by = {i["what"]: i for i in rec.items}
    assert set(by) == {"copy of unit 0", "step of unit 0"}
    assert by["copy of unit 0"]["end"] - by["copy of unit 0"]["start"] >= 0.009
    assert (streams.Lanes.device_lane, streams.Lanes.host_lane, streams.ThreadLane.submit) == before


def test_busy_counts_overlapping_intervals_once():
    items = [{"start": 0.0, "end": 4.0}, {"start": 2.0, "end": 6.0}, {"start": 8.0, "end": 9.0},
             {"start": 1.0, "end": None}]
    assert tl.busy(items, 0.0, 10.0) == 7.0
    assert tl.busy(items, 3.0, 8.5) == 3.5
    assert tl.busy(items, 6.0, 8.0) == 0.0


def run(*args):
    return subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "offload_timeline.py"), *args],
                          capture_output=True, text=True, timeout=600)


def test_cpu_standin_smoke(tmp_path):
    res = run("--cpu-standin", "--width", "32", "--layers", "3", "--rows", "4", "--steps", "2", "--warmup", "1",
              "--out", str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    figures = json.loads((tmp_path / "offload_timeline.json").read_text())
    names = [r["config"] for r in figures["runs"]]
    assert names == ["no offload", "offload serial"] + (["offload overlap"] if figures["overlap_available"] else [])
    for r in figures["runs"]:
        assert len(r["steps"]) == 3   # two steps and the last one's next forward
        for s in r["steps"][:-1]:
            assert s["forward_start"] <= s["forward_end"] <= s["backward_end"] <= s["step_return"]
        for it in r["lane_items"]:
            assert it["kind"] in ("device", "host") and it["start"] <= it["end"]
    assert "=== summary: median step ms no offload" in res.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip is for machines without a GPU")
def test_skips_cleanly_without_a_gpu():
    res = run()
    assert res.returncode == 0 and "offload_timeline: skipped: no GPU" in res.stdout
