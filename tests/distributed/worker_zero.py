"""One rank of ZeRO runs (see zero_common.py for the run format); rank 0 saves every rank's records."""
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
from dp_common import gather_records  # noqa: E402
from zero_common import full_params, parse, train  # noqa: E402


def run(text):
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    spec = parse(text)
    losses, engine = train(dsfast.initialize, spec, rank, world)
    # (stage 3: parameters above the persistence threshold are placeholders until gathered)
    gathered = dsfast.zero.GatheredParameters(list(engine.module.parameters())) if spec["stage"] == 3 else \
        contextlib.nullcontext()
    with gathered:
        module_sd = {k: v.float().clone() for k, v in engine.module.state_dict().items()}
    record = {"losses": losses, "params": full_params(engine), "skipped": engine.skipped_steps,
              "memory": engine.memory_breakdown(), "norm": engine.get_global_grad_norm(),
              "numel": sum(p.numel() for p in engine.module.parameters() if p.requires_grad),
              "module_sd": module_sd,
              "lrs": engine.get_lr(),
              # which reduction ran: every stage's owner reduces through reducer.py
              "reduction": (type(engine.state_owner.reducer).__module__, engine.state_owner.reducer.transport,
                            engine.state_owner.collectives_launched)}
    return gather_records(record)


def main():
    dsfast.init_distributed()
    results = {text: run(text) for text in sys.argv[2:]}
    if torch.distributed.get_rank() == 0:
        torch.save(results, sys.argv[1])


if __name__ == "__main__":
    main()
