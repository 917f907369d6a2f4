"""ZeRO stage 3's two multi-rank paths: same-host CPU ranks through /dev/shm, and the gloo fallback.

Same-host fp32 CPU ranks gather parameters out of a shared snapshot and reduce gradient buckets in a shared table
(shared_params.py, transports.ShmComm); DSFAST_SHM_ALLREDUCE=0 or a 16-bit model takes gloo collectives
(transports.C10dComm, coalesced all-gathers). Both must train exactly as one process at stage 0 does, with
small buckets (many buckets, shared slots reused, gradients arriving out of bucket order: the awkward model's
external weight, tied weights; a gradient arriving twice in one backward) and with the default one.
"""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dist_launch import launch, launch_runs  # noqa: E402
from test_zero3_dp import _check, reference  # noqa: E402

RUNS = {
    "plain_b600": "plain_b600:fp32:0:0:2:0.05:8:plain:config:-1:0:600",
    "awkward_b300": "awkward_b300:fp32:1:1:1:0.05:6:awkward:config:-1:0:300",
    "fancy_b400": "fancy_b400:fp32:0:0:2:0:6:fancy:config:-1:40:400",
    "awkward": "awkward:fp32:0:0:2:0.05:6:awkward:config:-1:0",
    "reuse": "reuse:fp32:0:0:2:0:6:reuse:config:-1:0",              # a second gradient before the reduction
    "reuse_b100": "reuse_b100:fp32:0:0:1:0:6:reuse:config:-1:0:100",  # and after it
    # stage3_prefetch_bucket_size: every coming module in flight at once / prefetching off (the gloo path prefetches)
    "fancy_prefetch_all": "fancy_prefetch_all:fp32:0:0:2:0.05:6:fancy:config:-1:0:0:1000000000",
    "awkward_no_prefetch": "awkward_no_prefetch:fp32:0:0:1:0:6:awkward:config:-1:0:0:0",
}
BF16 = {"bf16_b600": "bf16_b600:bf16:0:0:1:0:4:fancy:config:-1:0:600"}
RUNS3 = {k: RUNS[k] for k in ("plain_b600", "awkward_b300")}


def _launch(tmp_path_factory, runs, nprocs, env=None):
    return launch_runs(tmp_path_factory, os.path.join(HERE, "worker_zero3.py"), runs, nprocs, timeout=400,
                       extra_env=env)


@pytest.fixture(scope="module")
def shm(tmp_path_factory):
    return _launch(tmp_path_factory, {**RUNS, **BF16}, 2)


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    return _launch(tmp_path_factory, RUNS, 2, env={"DSFAST_SHM_ALLREDUCE": "0"})


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return _launch(tmp_path_factory, RUNS3, 3)


@pytest.mark.parametrize("key", sorted(RUNS))
def test_shared_memory_path_trains_as_one_process_at_stage0(shm, key):
    assert all(r["path"] == ("shm", True) for r in shm[key])
    got, want = _check(shm[key], RUNS[key], 2, atol=1e-5, rtol=1e-5)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("key", sorted(RUNS))
def test_gloo_fallback_trains_as_one_process_at_stage0(gloo, key):
    assert all(r["path"] == ("gloo", False) for r in gloo[key])
    got, want = _check(gloo[key], RUNS[key], 2, atol=1e-5, rtol=1e-5)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("key", sorted(RUNS3))
def test_three_ranks_uneven_padding_through_shared_memory(three, key):
    assert all(r["path"] == ("shm", True) for r in three[key])
    got, want = _check(three[key], RUNS3[key], 3, atol=1e-5, rtol=1e-5)
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_the_gloo_path_prefetches_in_forward_and_backward_within_the_bucket(shm, gloo):
    for key in RUNS:
        assert all(r["prefetched"] == (0, 0) for r in shm[key]), key     # shared memory: nothing to hide
    forward, backward = gloo["fancy_prefetch_all"][0]["prefetched"]
    assert forward > 0 and backward > 0
    assert gloo["awkward_no_prefetch"][0]["prefetched"] == (0, 0)       # stage3_prefetch_bucket_size 0
    steps = int(RUNS["plain_b600"].split(":")[6]) * int(RUNS["plain_b600"].split(":")[4])
    assert gloo["plain_b600"][0]["prefetched"][1] >= steps - 1         # every backward but the first


def test_both_paths_reduce_the_same_buckets_fewer_than_parameters(shm, gloo):
    for key in RUNS:
        n_params = len(shm[key][0]["shapes"])
        backwards = int(RUNS[key].split(":")[4]) * int(RUNS[key].split(":")[6])
        assert shm[key][0]["collectives"] == gloo[key][0]["collectives"], key
        assert shm[key][0]["collectives"] % backwards == 0, key   # the same buckets in every backward
        if key != "reuse_b100":   # (one parameter a bucket there, on purpose)
            assert shm[key][0]["collectives"] < n_params * backwards, key
    assert shm["awkward"][0]["collectives"] == 6 * 2   # default bucket size: the whole small model is one bucket
    assert shm["reuse"][0]["collectives"] == 6 * 2     # one bucket: the second gradient is added in before it
    assert shm["reuse_b100"][0]["collectives"] == 6 * (6 + 2)   # 6 buckets + 2 reduced again for the late ones


def test_a_16bit_model_takes_the_gloo_path(shm):
    ranks = shm["bf16_b600"]
    assert all(r["path"] == ("gloo", False) for r in ranks)
    _, want = reference(BF16["bf16_b600"], 2)
    got = torch.cat([ranks[0]["params"][n].flatten() for n in want])
    ref = torch.cat([want[n].flatten() for n in want])
    assert (got - ref).norm() / ref.norm() < 2e-2
    for n in want:
        assert torch.equal(ranks[1]["params"][n], ranks[0]["params"][n])


@pytest.mark.parametrize("env,path", [({}, ("shm", True)),
                                      ({"DSFAST_SHM_ALLREDUCE": "0"}, ("gloo", False))])
def test_gathered_parameters_modifier_reaches_every_rank(tmp_path, env, path):
    out = tmp_path / "out.pt"
    launch(os.path.join(HERE, "worker_zero3_modify.py"), [out], nprocs=2, timeout=200, extra_env=env)
    ranks = torch.load(out)
    for r in ranks:
        assert r["path"] == path
        assert torch.equal(r["kept"], torch.full_like(r["kept"], 0.5))          # rank 1's values, everywhere
        assert torch.equal(r["after_discard"], r["kept"])                       # modifier_rank=None: discarded
        assert torch.equal(r["master"], r["kept"])                              # the fp32 master followed
        torch.testing.assert_close(r["out"], ranks[0]["out"], rtol=0, atol=0)   # forwards gather the new values
        for n, v in r["final"].items():
            assert torch.equal(v, ranks[0]["final"][n]), n
    assert not torch.equal(ranks[0]["final"]["0.weight"], ranks[0]["kept"])    # and training went on from there
