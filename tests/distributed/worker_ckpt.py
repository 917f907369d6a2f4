"""One rank of the checkpoint tests. argv: mode out_dir [args]; modes:

  train PREC N M          N steps, save (tag "t{N}"), M more; rank 0 dumps the state at the save and at the end
  resume PREC M           load `latest`, dump the state right after the load, M more steps, dump the end
  seeds                   the seeds' loop: float tags from loss.item() (reduced, so equal on all ranks), client_sd=
  kill PREC POINT TAG     save "good", one more step, save TAG with DSFAST_CHECKPOINT_FAULT=POINT (SIGKILL there)
  misuse                  differing tags (an error on every rank under Fail; under Warn a warning and rank 0's tag),
                          then save on rank 0 only (an error in bound)
The model/data come from dp_common; the global batch of a step is split over the ranks.
"""
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dsfast as deepspeed  # noqa: E402
from dp_common import MICRO, build_model, ds_config, global_batch  # noqa: E402


def engine_for(precision, stage=0, tag_validation="Warn"):
    cfg = ds_config(precision, 1, torch.distributed.get_world_size(), 0.0)
    if precision == "fp32":   # an LR schedule in fp32 too, so exact resume covers it
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-2}}
    cfg["zero_optimization"] = {"stage": stage}
    cfg["checkpoint"] = {"tag_validation": tag_validation}
    model = build_model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return engine


def train(engine, first, last):
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    loss = None
    for step in range(first, last):
        x, y = global_batch(step, MICRO * world)
        lo = rank * MICRO
        loss = torch.nn.functional.mse_loss(engine(x[lo:lo + MICRO]).float(), y[lo:lo + MICRO])
        engine.backward(loss)
        engine.step()
    return loss


def snapshot(engine):
    opt = engine.optimizer
    live = [m for g in opt.param_groups for m in g["params"]]   # stage 0 steps the fp32 masters
    masters = [m.detach().clone() for m in live]
    states = [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[m].items()} for m in live]
    return {"masters": masters, "states": states, "module": {k: v.clone() for k, v in engine.module.state_dict().items()},
            "loss_scale": engine.loss_scale, "lr": engine.get_lr(), "global_steps": engine.global_steps,
            "lr_state": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None}


def dump(obj, path):
    if torch.distributed.get_rank() == 0:
        torch.save(obj, path)


def main():
    deepspeed.init_distributed()
    mode, out = sys.argv[1], sys.argv[2]
    rank = torch.distributed.get_rank()
    ckpt = os.path.join(out, "ckpt")
    if mode == "train":
        precision, n, m = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        engine = engine_for(precision)
        train(engine, 0, n)
        engine.save_checkpoint(ckpt, f"t{n}", client_state={"step": n, "rank0": rank == 0})
        dump(snapshot(engine), os.path.join(out, "at_save.pt"))
        train(engine, n, n + m)
        dump(snapshot(engine), os.path.join(out, "end.pt"))
    elif mode == "resume":
        precision, m = sys.argv[3], int(sys.argv[4])
        engine = engine_for(precision)
        path, client = engine.load_checkpoint(ckpt)
        n = client["step"]
        dump(dict(snapshot(engine), path=path, client=client), os.path.join(out, f"loaded_w{engine.world_size}.pt"))
        train(engine, n, n + m)
        dump(snapshot(engine), os.path.join(out, f"resumed_w{engine.world_size}.pt"))
    elif mode == "seeds":
        engine = engine_for("fp32")
        _, client_sd = engine.load_checkpoint(ckpt, None)     # nothing there yet: (None, None)
        assert client_sd is None
        client_sd, tags = {}, []
        for step in range(4):
            loss = train(engine, step, step + 1)
            torch.distributed.all_reduce(loss := loss.detach().clone())   # the same float on every rank
            if step % 2:
                client_sd["step"] = step
                ckpt_id = loss.item()
                engine.save_checkpoint(ckpt, ckpt_id, client_sd=client_sd)
                tags.append(str(ckpt_id))
        fresh = engine_for("fp32")
        _, client_sd = fresh.load_checkpoint(ckpt, tags[-1])
        assert client_sd["step"] == 3, client_sd
        assert all(torch.equal(a, b) for a, b in zip(fresh.module.parameters(), engine.module.parameters()))
        dump({"tags": tags, "latest": open(os.path.join(ckpt, "latest")).read()}, os.path.join(out, "seeds.pt"))
    elif mode == "kill":
        precision, point = sys.argv[3], sys.argv[4]
        engine = engine_for(precision)
        train(engine, 0, 2)
        engine.save_checkpoint(ckpt, "good", client_state={"step": 2})
        dump(snapshot(engine), os.path.join(out, "good.pt"))
        train(engine, 2, 3)
        os.environ["DSFAST_CHECKPOINT_FAULT"] = point
        os.environ["DSFAST_CHECKPOINT_TIMEOUT_S"] = "4"
        try:
            engine.save_checkpoint(ckpt, sys.argv[5], client_state={"step": 3})
        except deepspeed.checkpoint.CheckpointError as err:   # the surviving ranks: a clear error, no hang
            print(f"SURVIVOR rank {rank}: {err}", flush=True)
            os._exit(3)
        print(f"rank {rank}: save returned although {point} was killed", flush=True)
        os._exit(4)
    elif mode == "misuse":
        engine = engine_for("fp32", tag_validation="Fail")
        train(engine, 0, 1)
        result = {}
        try:
            engine.save_checkpoint(ckpt, f"tag_of_rank{rank}")
        except deepspeed.checkpoint.CheckpointError as err:
            result["tags"] = str(err)
            result["assertion"] = isinstance(err, AssertionError)    # DeepSpeed's type for it
        engine.config.checkpoint.tag_validation = "Warn"     # DeepSpeed's default: warn, save (under rank 0's tag)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine.save_checkpoint(ckpt, f"warn_of_rank{rank}")
        result["warned"] = any("warn_of_rank1" in str(w.message) for w in caught)
        os.environ["DSFAST_CHECKPOINT_TIMEOUT_S"] = sys.argv[3]
        if rank == 0:
            t0 = time.monotonic()
            try:
                engine.save_checkpoint(ckpt, "only_rank0")
            except deepspeed.checkpoint.CheckpointTimeoutError as err:
                result["rank0_only"] = str(err)
            result["elapsed"] = time.monotonic() - t0
        torch.distributed.barrier()
        print("RESULT " + json.dumps(result), flush=True)
    else:
        raise SystemExit(f"unknown mode {mode}")
    torch.distributed.barrier()   # no rank tears gloo down while rank 0 still writes its dump


if __name__ == "__main__":
    main()
