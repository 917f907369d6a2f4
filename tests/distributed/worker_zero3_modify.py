"""One rank: GatheredParameters(modifier_rank=...) on a trained ZeRO stage 3 engine, then training on.

Checks (recorded for rank 0 to save) that the modifier rank's values reach every rank's partitions and later
gathers (the shared-memory snapshot on same-host ranks), that modifier_rank=None discards changes, and that the
next step runs from the modified values on every rank alike.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
from dp_common import D_IN, MICRO, build_model, gather_records, global_batch  # noqa: E402
from zero_common import full_params  # noqa: E402


def main():
    dsfast.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    model = build_model()
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "zero_optimization": {"stage": 3, "param_persistence_threshold": 0}}
    engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]
    x, y = global_batch(0, MICRO * world)
    x, y = x[rank * MICRO:(rank + 1) * MICRO], y[rank * MICRO:(rank + 1) * MICRO]
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    engine.step()
    w = engine.module[0].weight
    with dsfast.zero.GatheredParameters([w], modifier_rank=world - 1):
        if rank == world - 1:
            w.data.fill_(0.5)
    with dsfast.zero.GatheredParameters([w]):
        kept = w.detach().clone()
        w.data.fill_(7.0)   # modifier_rank=None: discarded on exit
    with dsfast.zero.GatheredParameters([w]):
        after_discard = w.detach().clone()
    probe = torch.ones(1, D_IN)
    with torch.no_grad():
        out = engine(probe).clone()   # the forward gathers the modified weight
    master = full_params(engine)["0.weight"]
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    engine.step()
    record = {"kept": kept, "after_discard": after_discard, "master": master, "out": out,
              "final": full_params(engine), "path": (engine.state_owner.reducer.transport,
                                                    engine.state_owner.gathers_through == "shm")}
    gathered = gather_records(record)
    if rank == 0:
        torch.save(gathered, sys.argv[1])
    # no destroy_process_group() here: dsfast's exit hook meets every rank before it tears gloo down


if __name__ == "__main__":
    main()
