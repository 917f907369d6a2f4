"""One rank of the clipping runs (tests/_deepspeed_cases.py CLIP_CASES) under DeepSpeed or dsfast; rank 0 writes
{case id: trace} as JSON.

    worker_clip.py OUT deepspeed|dsfast [case id ...]      (no case id: every case)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/
os.environ.setdefault("DS_ACCELERATOR", "cpu")
import _deepspeed_cases as cases  # noqa: E402


def main():
    out, library, wanted = sys.argv[1], sys.argv[2], set(sys.argv[3:])
    if library == "deepspeed":
        import deepspeed as lib
        lib.init_distributed(dist_backend="gloo")
    else:
        import dsfast as lib
        lib.init_distributed()
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    traces = {}
    for case in cases.CLIP_CASES:
        key = cases.clip_case_id(*case)
        if not wanted or key in wanted:
            traces[key] = cases.clip_trace(lib.initialize, lib.zero.GatheredParameters, *case, rank=rank, world=world)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(traces, f)


if __name__ == "__main__":
    main()
