"""ZeRO stage 3 leaf modules on 2 gloo ranks whose samples route to different experts of an MoE block
(moe_common.py), with gathers by collectives (DSFAST_SHM_ALLREDUCE=0: the path where ranks' gathers must pair).
Marked a leaf (deepspeed.utils.set_z3_leaf_modules, or zero_optimization.leaf_module), the block trains exactly as
one torch process on the whole batch; unmarked, the ranks' all-gathers pair different experts (of equal sizes, so
nothing fails by itself and the numbers go wrong): the first backward stops on every rank naming the parameters
and the fix (DeepSpeed 0.19.8 hangs or computes wrong values there)."""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch_runs  # noqa: E402
from moe_common import torch_reference  # noqa: E402

STEPS = 4
RUNS = {"api": f"api:api:{STEPS}", "config": f"config:config:{STEPS}", "none": f"none:none:{STEPS}"}


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return launch_runs(tmp_path_factory, os.path.join(HERE, "worker_zero3_leaf.py"), RUNS, 2, timeout=240,
                       extra_env={"DSFAST_SHM_ALLREDUCE": "0"})


@pytest.mark.parametrize("how", ["api", "config"])
def test_a_leaf_moe_block_whose_ranks_run_different_experts_trains_as_one_torch_process(moe, how):
    want = torch_reference(STEPS, 2)[-1]
    for r in moe[how]:
        assert r["path"] == "collectives" and r["flagged"] == ["moe"], r
        assert r["leaf_params"] == sorted(n for n in want if n.startswith("moe.")), r["leaf_params"]
        for n in want:
            torch.testing.assert_close(r["params"][n], want[n], atol=1e-6, rtol=1e-5, msg=n)
    assert moe["api"][0]["leaves"] == ["SparseMoE"]
    assert moe["api"][0]["losses"] == moe["config"][0]["losses"]


def test_without_the_leaf_the_first_backward_stops_naming_the_experts_and_the_fix(moe):
    for r in moe["none"]:
        assert r["losses"] == [], r
        assert "all-gathered different parameters" in r["error"], r["error"]
        assert "moe.experts.0.fc.weight on rank 0, moe.experts.1.fc.weight on rank 1" in r["error"], r["error"]
        assert "set_z3_leaf_modules(model, [TheBlockClass])" in r["error"], r["error"]
