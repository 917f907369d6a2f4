"""One rank: for each stage and precision, train with an optimizer, save, build an engine without one (evaluation,
a reference model), load the checkpoint; every rank checks it holds exactly the trained weights.

    worker_load_no_optimizer.py CKPT_ROOT stage:precision ...
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast  # noqa: E402
from dp_common import MICRO, build_model, global_batch  # noqa: E402


def config(stage, precision, optimizer):
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "steps_per_print": 1000,
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    if optimizer:
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 5e-2}}
    if precision != "fp32":
        cfg[precision] = {"enabled": True, **({"initial_scale_power": 8} if precision == "fp16" else {})}
    return cfg


def whole(engine):
    params = list(engine.module.parameters())
    with dsfast.zero.GatheredParameters(params):
        return [p.detach().clone() for p in params]


def main():
    dsfast.init_distributed()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    for run in sys.argv[2:]:
        stage, precision = run.split(":")
        save_dir = os.path.join(sys.argv[1], run.replace(":", "_"))
        engine = dsfast.initialize(model=build_model(), config=config(int(stage), precision, True))[0]
        for step in range(3):
            x, y = global_batch(step, MICRO * world)
            part = slice(rank * MICRO, (rank + 1) * MICRO)
            engine.backward(torch.nn.functional.mse_loss(engine(x[part]).float(), y[part]))
            engine.step()
        engine.save_checkpoint(save_dir)
        trained = whole(engine)
        fresh = dsfast.initialize(model=build_model(), config=config(int(stage), precision, False))[0]
        assert fresh.optimizer is None
        before = whole(fresh)
        assert any(not torch.equal(a, b) for a, b in zip(before, trained)), run
        fresh.load_checkpoint(save_dir)
        bad = [i for i, (a, b) in enumerate(zip(whole(fresh), trained)) if not torch.equal(a, b)]
        assert not bad, f"{run}: rank {rank}: parameters {bad} differ from the trained ones after load_checkpoint"
        print(f"rank {rank}: {run} loaded exactly", flush=True)


if __name__ == "__main__":
    main()
