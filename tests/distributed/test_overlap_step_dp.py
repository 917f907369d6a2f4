"""offload_optimizer.overlap_step on 2 gloo ranks (same host: stages 1-2 gather through /dev/shm from the worker on
a group of their own; stage 3 by collectives, and through its /dev/shm snapshot where host and device are one), under the test placement and the chaos delays: every
parameter, fp32 master and Adam state bitwise those of the serial step, on each rank; a failure in one rank's
worker is raised on both ranks at the next call, naming the unit and the step, and again at every later call. With
the optimizer states on NVMe (":nvme" rows) the same, and a failed write in one rank's worker reaches both; with
stage 3's parameter shards on NVMe (":pnvme", the worker writing them while the forward's gathers read) the same."""
import os
import re
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from dist_launch import launch  # noqa: E402
from _overlap_helpers import assert_same  # noqa: E402

PAIRS = [(1, "bf16", ""), (2, "fp32", ""), (3, "bf16", ""), (3, "fp32", ":plain"), (2, "bf16", ":nvme"),
         (3, "fp32", ":nvme"), (3, "bf16", ":pnvme")]
ENV = {"DSFAST_TEST_PLACEMENT": "distinct-host", "DSFAST_STREAM_CHAOS": "3", "DSFAST_STREAM_CHAOS_MS": "2"}


def test_overlap_is_bitwise_the_serial_step_and_failures_reach_every_rank(tmp_path):
    runs = [f"{s}:{p}:{o}{x}" for s, p, x in PAIRS for o in (0, 1)] + ["fail:2", "fail:3", "failnvme:2", "failpnvme:3"]
    out = tmp_path / "out.pt"
    launch(os.path.join(HERE, "worker_overlap.py"), [out, *runs], nprocs=2, timeout=240, extra_env=ENV)
    for rank in (0, 1):
        got = torch.load(f"{out}.{rank}", weights_only=False)
        for s, p, x in PAIRS:
            serial, overlapped = got[f"{s}:{p}:0{x}"], got[f"{s}:{p}:1{x}"]
            assert serial["losses"] == overlapped["losses"], (rank, s, p)
            assert_same(serial, overlapped)
        assert got["3:fp32:1:plain"]["gathers"] == "shm" and got["3:bf16:1"]["gathers"] == "collectives"
        assert got["3:bf16:1:pnvme"]["param_nvme"] and got["3:bf16:1:pnvme"]["gathers"] == "collectives"
        for stage in (2, 3):
            message = got[f"fail:{stage}"]
            assert message is not None, (rank, stage)
            assert "optimizer step 2 failed on rank 1 at unit" in message and "(parameters " in message, message
            if rank == 1:
                assert "OSError: disk on fire" in message
        # states on NVMe: rank 1's failed write reaches both ranks at the next backward (the settle's agreement)
        for run, file in (("failnvme:2", "unit"), ("failpnvme:3", "param")):   # (states; parameter shards)
            message = got[run]
            assert message is not None and "optimizer step 2 failed on rank 1 at unit" in message, (rank, message)
            if rank == 1:
                assert re.search(rf"SwapError: NVMe swap write of '[^']*/{file}\d+\.swap'", message), message
                assert "No space left on device" in message, message
