"""One rank of ZeRO stage 3 runs (see zero3_common.py for the run format); rank 0 saves every rank's records."""
import io
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
from dp_common import gather_records  # noqa: E402
from zero3_common import parse, train  # noqa: E402
from zero_common import full_params  # noqa: E402


def run(text):
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    spec = parse(text)
    memory = []
    losses, engine = train(dsfast.initialize, spec, rank, world,
                           on_step=lambda e: memory.append(e.memory_breakdown()))
    sd = engine.module.state_dict()         # DeepSpeed's placeholders, which save into a file that cannot load
    placeholders = {k: (type(v).__name__, v.numel()) for k, v in sd.items()}
    saved, save_error = io.BytesIO(), None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(sd, saved)
    try:
        torch.load(io.BytesIO(saved.getvalue()), weights_only=False)
    except RuntimeError as err:
        save_error = str(err)
    with dsfast.zero.GatheredParameters(list(engine.module.parameters())):
        module_sd = {k: v.float().clone() for k, v in engine.module.state_dict().items()}
        params = full_params(engine)   # frozen parameters (no fp32 master) are read whole inside the block
    record = {"losses": losses, "params": params, "skipped": engine.skipped_steps,
              "memory": memory, "norm": engine.get_global_grad_norm(),
              "placeholders": placeholders, "save_error": save_error,
              "numel": sum(p.ds_numel if hasattr(p, "ds_numel") else p._dsfast_z3.numel
                           for p in engine.module.parameters() if p.requires_grad),
              "module_sd": module_sd, "lrs": engine.get_lr(),
              # which stage-3 path ran: the gradient reduction's class, whether gathers read /dev/shm
              "path": (engine.state_owner.reducer.transport, engine.state_owner.gathers_through == "shm"),
              "collectives": engine.state_owner.collectives_launched,
              # (an internal on purpose: whether prefetch ran is the coordinator's, no protocol member's)
              "prefetched": engine.state_owner.coordinator.prefetch_launches(),
              "shapes": {n: tuple(p.shape) for n, p in engine.module.named_parameters()}}
    return gather_records(record)


def main():
    dsfast.init_distributed()
    results = {text: run(text) for text in sys.argv[2:]}
    if torch.distributed.get_rank() == 0:
        torch.save(results, sys.argv[1])
    # no destroy_process_group() here: dsfast's exit hook meets every rank before it tears gloo down


if __name__ == "__main__":
    main()
