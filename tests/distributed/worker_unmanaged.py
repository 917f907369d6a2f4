"""One rank of managed_gradient_accumulation=false runs (unmanaged_common.py); rank 0 saves the results.

    worker_unmanaged.py OUT stage:precision:offload ...
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
from unmanaged_common import train  # noqa: E402


def full_weights(engine):
    params = list(engine.module.parameters())
    with dsfast.zero.GatheredParameters(params):
        return [p.detach().float().clone() for p in params]


def main():
    dsfast.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    results = {}
    for run in sys.argv[2:]:
        stage, precision, offload = run.split(":")
        engine, seen, samples = train(dsfast.initialize, int(stage), precision, offload == "1", rank, world)
        results[run] = {"weights": full_weights(engine), "seen": seen, "samples": samples,
                        "global_steps": engine.global_steps, "micro_steps": engine.micro_steps}
    if rank == 0:
        torch.save(results, sys.argv[1])


if __name__ == "__main__":
    main()
