"""One rank of a data-parallel engine run on a fixed global batch; rank 0 saves the results.

argv: out_path run [run ...], each run "precision:gas:clip:steps[:inject_overflow_rank]"; the runs share the
processes (one start-up for several checks). Saves {run: [record per rank]}.
The global batch of every step is generated from a seed (same on all ranks); micro-step i of rank r takes
samples [(i * world + r) * micro, ... + micro), so the union over ranks and micro-steps is the global batch.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast as deepspeed  # noqa: E402
from dp_common import MICRO, RankDependentSpare, build_model, gather_records, global_batch, ds_config  # noqa: E402


def main():
    deepspeed.init_distributed()
    results = {run: train(*parse(run)) for run in sys.argv[2:]}
    if torch.distributed.get_rank() == 0:
        torch.save(results, sys.argv[1])


def parse(run):
    parts = run.split(":")
    return (parts[0], int(parts[1]), float(parts[2]), int(parts[3]), int(parts[4]) if len(parts) > 4 else -1,
            len(parts) > 5 and parts[5] == "spare")


def train(precision, gas, clip, steps, inject_rank, spare=False):
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    model = RankDependentSpare(rank) if spare else build_model()
    cfg = ds_config(precision, gas, world, clip)
    engine, opt, _, sched = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    record = {"losses": [], "norms": [], "scales": [], "skipped": [], "global_steps": [], "lr_iter": [],
              "params": [], "states": []}
    for step in range(steps):
        x, y = global_batch(step, MICRO * gas * world)
        for i in range(gas):
            lo = (i * world + rank) * MICRO
            loss = torch.nn.functional.mse_loss(engine(x[lo:lo + MICRO]).float(), y[lo:lo + MICRO])
            if step == 1 and rank == inject_rank:
                loss = loss * float("inf")  # an fp16 overflow on one rank only
            engine.backward(loss)
            engine.step()
        record["norms"].append(engine.get_global_grad_norm())
        record["scales"].append(engine.loss_scale)
        record["skipped"].append(engine.skipped_steps)
        record["global_steps"].append(engine.global_steps)
        record["lr_iter"].append(getattr(sched, "last_batch_iteration", None))
        masters = [m for g in opt.param_groups for m in g["params"]]   # stage 0 steps the fp32 masters
        record["params"].append([m.detach().float().clone() for m in masters])
        record["states"].append({k: v.clone() for m in masters for k, v in opt.state[m].items()
                                 if torch.is_tensor(v)} if masters and opt.state[masters[0]] else {})
    record["model_dtype"] = str(next(engine.module.parameters()).dtype)
    record["collectives"] = engine.state_owner.collectives_launched
    record["sync"] = engine.state_owner.reducer.transport
    x, y = global_batch(99, MICRO * gas * world)
    for i in range(gas):  # a second backward in the boundary micro-step is accepted (GAN pattern)
        engine.backward(torch.nn.functional.mse_loss(engine(x[:MICRO]).float(), y[:MICRO]))
        if i < gas - 1:
            engine.step()
    try:
        engine.backward(torch.nn.functional.mse_loss(engine(x[:MICRO]).float(), y[:MICRO]))
        record["double_backward"] = "accepted"
    except RuntimeError as err:
        record["double_backward"] = str(err)
    record["buckets"] = len(engine.state_owner.memory_tensors()["grads"])   # stage 0: one flat per bucket
    return gather_records(record)


if __name__ == "__main__":
    main()
