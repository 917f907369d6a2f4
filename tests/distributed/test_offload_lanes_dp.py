"""The offload copies on lanes (issue 28) on 2 gloo ranks: under the test placement the gradient copies to the host
and the 16-bit uploads run on worker-thread lanes, delayed at random by the chaos mode; each reader waits for its
unit's event. Training must be bitwise what the same ranks give with chaos off and without the test placement (no
copies at all). The in-process rows are tests/test_offload_lanes.py."""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch  # noqa: E402

# stage 2 bf16 (reduce-scatters, host16 uploads) and stage 3 fp32 (bucketed reduction, fp32 masters uploaded)
RUNS = ["lanes2bf16:2:bf16:1:2:0.05:3:plain:config:-1", "lanes3fp32:3:fp32:1:2:0.05:3:plain:config:-1"]
ENVS = {"plain": {},
        "distinct": {"DSFAST_TEST_PLACEMENT": "distinct-host"},
        "chaos": {"DSFAST_TEST_PLACEMENT": "distinct-host", "DSFAST_STREAM_CHAOS": "5",
                  "DSFAST_STREAM_CHAOS_MS": "4"}}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = {}
    for name, env in ENVS.items():
        path = tmp_path_factory.mktemp(f"lanes_{name}") / "out.pt"
        launch(os.path.join(HERE, "worker_zero.py"), [path, *RUNS], nprocs=2, timeout=300, extra_env=env)
        out[name] = torch.load(path)
    return out


def _same(got, want):
    assert len(got) == len(want) == 2   # one record per rank
    for g, w in zip(got, want):
        assert g["losses"] == w["losses"] and g["skipped"] == w["skipped"]
        for key in ("params", "module_sd"):
            assert set(g[key]) == set(w[key])
            for name in w[key]:
                assert torch.equal(g[key][name], w[key][name]), (key, name)


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("env", ["distinct", "chaos"])
def test_copies_on_lanes_on_two_ranks_train_bitwise_as_without_copies(results, env, run):
    _same(results[env][run], results["plain"][run])
