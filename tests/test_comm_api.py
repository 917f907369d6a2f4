"""deepspeed.comm's API (dsfast.comm): every call on 2 real gloo ranks with known results, the errors before
init_distributed(), the launcher-environment helpers, and the signatures against DeepSpeed's (where it imports)."""
import inspect
import os
import sys

import pytest
import torch

import dsfast
from dsfast import comm as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "distributed"))
from dist_launch import launch  # noqa: E402

WORKER = os.path.join(HERE, "distributed", "worker_comm_api.py")


def test_every_call_on_two_gloo_ranks():
    results = launch(WORKER, nprocs=2, timeout=120)
    for rank, (rc, out) in enumerate(results):
        assert rc == 0 and f"COMM_API_OK rank {rank}" in out, out


@pytest.mark.parametrize("call", ["get_rank", "get_world_size", "get_local_rank", "get_backend", "barrier",
                                  "destroy_process_group", "get_global_rank", "get_world_group"])
def test_calls_before_init_distributed_name_the_fix(call):
    if torch.distributed.is_initialized():
        pytest.skip("a process group exists in this test process")
    with pytest.raises(dist.CommNotInitializedError) as info:
        getattr(dist, call)()
    assert f"deepspeed.comm.{call}()" in str(info.value) and "init_distributed()" in str(info.value)
    assert isinstance(info.value, AssertionError)   # what DeepSpeed raises here


def test_collective_before_init_is_the_same_clear_error():
    if torch.distributed.is_initialized():
        pytest.skip("a process group exists in this test process")
    with pytest.raises(dist.CommNotInitializedError, match=r"deepspeed.comm.all_reduce\(\)"):
        dist.all_reduce(torch.ones(1))
    with pytest.raises(dist.CommNotInitializedError, match=r"all_gather_into_tensor"):
        dist.allgather_fn(torch.zeros(2), torch.ones(1))
    assert dist.is_initialized() is False and dist.is_available() is True


def test_launcher_environment_helpers(monkeypatch):
    for key in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "WORLD_SIZE",
                "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    assert (dist.get_local_rank_from_launcher(), dist.get_world_rank_from_launcher(),
            dist.get_world_size_from_launcher()) == (0, 0, 1)
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert dist.get_local_rank_from_launcher() == 3
    monkeypatch.setenv("LOCAL_RANK", "1")       # the launcher's own variable wins
    assert dist.get_local_rank_from_launcher() == 1
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(ValueError, match="LOCAL_RANK='x'"):
        dist.get_local_rank_from_launcher()


def test_reduce_op_is_torchs_and_p2pop_checks_its_op():
    assert dist.ReduceOp is torch.distributed.ReduceOp
    assert {"SUM", "AVG", "MAX", "MIN", "PRODUCT"} <= set(dir(dist.ReduceOp))
    with pytest.raises(ValueError, match="isend or deepspeed.comm.irecv"):
        dist.P2POp(dist.send, torch.zeros(1), 0)
    assert dist.log_summary() is None and dist.configure(enabled=True) is None


def test_reachable_as_deepspeed_comm():
    assert dsfast.comm is dist and dsfast.init_distributed is dist.init_distributed


# DeepSpeed's comm functions whose parameter lists ours must match (names and order).
SAME_SIGNATURE = ["all_reduce", "inference_all_reduce", "all_reduce_coalesced", "reduce", "broadcast",
                  "broadcast_object_list", "all_gather", "all_gather_object", "all_gather_into_tensor",
                  "allgather_fn", "all_gather_coalesced", "reduce_scatter_tensor", "reduce_scatter_fn",
                  "reduce_scatter", "all_to_all_single", "all_to_all", "gather", "scatter", "send", "recv", "isend",
                  "irecv", "batch_isend_irecv", "barrier", "monitored_barrier", "get_rank", "get_world_size",
                  "get_local_rank", "get_global_rank", "get_all_ranks_from_group", "is_initialized", "is_available",
                  "destroy_process_group", "new_group", "log_summary", "configure", "get_world_group"]


def _unwrapped(fn):
    """DeepSpeed's timing decorator hides the signature (no functools.wraps); the function is in its closure."""
    for cell in fn.__closure__ or ():
        if inspect.isfunction(cell.cell_contents):
            return cell.cell_contents
    return fn


def test_signatures_match_deepspeed():
    """Optional (runs where deepspeed imports, e.g. /work/venv-ds with DS_ACCELERATOR=cpu)."""
    theirs = pytest.importorskip("deepspeed.comm")
    for name in SAME_SIGNATURE:
        want = list(inspect.signature(_unwrapped(getattr(theirs, name))).parameters)
        got = list(inspect.signature(getattr(dist, name)).parameters)
        if name == "new_group":           # ours forwards torch's extra new_group options
            got = [p for p in got if p != "kwargs"]
        assert got == want, (name, got, want)
