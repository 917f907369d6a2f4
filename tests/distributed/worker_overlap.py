"""One rank of the overlap_step runs on 2 gloo ranks (tests/distributed/test_overlap_step_dp.py); each rank saves
its results to OUT.<rank>.

    worker_overlap.py OUT stage:precision:overlap[:plain|:nvme|:pnvme] ... [fail:stage] [failnvme:stage]
        [failpnvme:3]
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import dsfast  # noqa: E402
from _overlap_helpers import engine, fail_second_group_step, snapshot, train  # noqa: E402
from dsfast.zero.step.overlap import OverlapFailure  # noqa: E402


def failing_run(stage, rank):
    """Rank 1's worker fails in the second step: every rank must raise, naming the unit and the step."""
    eng = engine(stage, world=2)
    train(eng, 1, rank=rank)
    eng.state_owner.settle()
    if rank == 1:
        fail_second_group_step(eng.optimizer)
    train(eng, 1, rank=rank)   # returns: the failure is in rank 1's worker
    try:
        train(eng, 1, rank=rank)
    except OverlapFailure as e:
        first = str(e)
    else:
        return None
    try:   # and again at every later call, on every rank
        dsfast.utils.safe_get_full_fp32_param(next(eng.module.parameters()))
    except OverlapFailure as e:
        return first if str(e) == first else f"a different second failure: {e}"
    return "no second failure"


def failing_nvme_run(stage, rank, where, params=False):
    """States (params: stage 3's parameter shards) on NVMe: rank 1's second write of the second step fails in its
    worker; every rank must raise at the next backward, naming the unit and the step."""
    path = os.path.join(where, f"fail{stage}{'p' * params}-rank{rank}")
    eng = engine(stage, world=2, nvme=None if params else path, param_nvme=path if params else None)
    train(eng, 1, rank=rank)
    eng.state_owner.settle()
    if rank == 1:
        from dsfast.zero.nvme import io as nvme_io
        real, calls = nvme_io.os.pwritev, []

        def fails_second(fd, buffers, offset):
            calls.append(fd)
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            return real(fd, buffers, offset)
        nvme_io.os.pwritev = fails_second
    train(eng, 1, rank=rank)
    try:
        train(eng, 1, rank=rank)
    except OverlapFailure as e:
        return str(e)
    return None


def main():
    dsfast.init_distributed()
    rank = torch.distributed.get_rank()
    results = {}
    for run in sys.argv[2:]:
        if run.startswith(("failnvme:", "failpnvme:")):
            os.environ["DSFAST_TEST_PLACEMENT"] = "distinct-host"
            results[run] = failing_nvme_run(int(run.split(":")[1]), rank, os.path.dirname(sys.argv[1]),
                                            params=run.startswith("failp"))
            continue
        if run.startswith("fail:"):   # (host and device the same memory: the worker reads the gradients in place)
            os.environ["DSFAST_TEST_PLACEMENT"] = ""
            results[run] = failing_run(int(run.split(":")[1]), rank)
            continue
        stage, precision, overlap, *placement = run.split(":")
        # (":plain": host and device the same memory, so that stage 3's same-host ranks gather through /dev/shm)
        # (":nvme": the optimizer states on NVMe, under a directory of this run and rank)
        os.environ["DSFAST_TEST_PLACEMENT"] = "" if placement == ["plain"] else "distinct-host"
        # (":pnvme": stage 3's parameter shards on NVMe, the states on cpu)
        where = os.path.join(os.path.dirname(sys.argv[1]), f"{run.replace(':', '-')}-rank{rank}")
        nvme = where if placement == ["nvme"] else None
        eng = engine(int(stage), precision=precision, overlap=overlap == "1", clip=0.05, scheduler=True, world=2,
                     nvme=nvme, param_nvme=where if placement == ["pnvme"] else None)
        losses = train(eng, 3 if nvme is None else 4, rank=rank)   # (4: the warmup's first steps barely move)
        results[run] = {"losses": losses, "gathers": eng.state_owner.gathers_through,
                        "param_nvme": getattr(eng.state_owner, "param_swap", None) is not None, **snapshot(eng)}
    torch.save(results, f"{sys.argv[1]}.{rank}")


if __name__ == "__main__":
    main()
