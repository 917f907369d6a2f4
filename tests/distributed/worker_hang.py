"""Ranks that stop agreeing, for test_hang_watch.py: each case makes one rank leave the others' path; the hang
watch (DSFAST_HANG_WATCH_S, set by the test) must stop every rank with a message saying which rank is where.

argv: case out_dir. Cases:
  uneven  rank 0 runs one more micro-batch than rank 1 (stage 3; rank 1's program then ends)
  skip    rank 1 skips `layers.1` in its second forward (a data-dependent branch, stage 3)
  save    rank 1 saves a checkpoint after step 1 while rank 0 trains on (stage 2)
  eval    rank 1 runs an eval forward after step 1 while rank 0 trains (stage 3)
  killed  rank 1 is killed in the middle of its second backward (stage 3)
  calm    no hang: rank 1 sleeps longer than the watch's threshold before a collective (stage 3), then both ranks
          pass different tags to save_checkpoint (under tag_validation Fail: an error on both, not a hang); writes rank<r>.txt when done
"""
import os
import signal
import sys
import time

import torch

import dsfast as deepspeed

CASE, OUT = sys.argv[1], sys.argv[2]
SLOW_S = float(os.environ.get("SLOW_S", "0"))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.skip_middle = False

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i == 1 and self.skip_middle:
                continue
            x = torch.tanh(layer(x))
        return x.pow(2).mean()


def main():
    stage = 2 if CASE == "save" else 3
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": None,
              "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
              "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
              # "Fail": different tags are an error on every rank (the default "Warn" saves under rank 0's tag)
              "checkpoint": {"tag_validation": "Fail"}}
    model = Net()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank = engine.global_rank
    x = torch.randn(2, 8).to(engine.device)   # a GPU under NCCL (benchmarks/hang_nccl.py)
    steps = 3 if (CASE == "uneven" and rank == 0) else 2 if CASE == "uneven" else 3

    def train_step(i):
        if CASE == "skip" and rank == 1 and i == 1:
            model.skip_middle = True
        if CASE == "calm" and rank == 1 and i == 1:
            time.sleep(SLOW_S)           # slower than the threshold, then the same collective as rank 0
        loss = engine(x)
        if CASE == "killed" and rank == 1 and i == 1:
            loss.register_hook(lambda g: os.kill(os.getpid(), signal.SIGKILL))
        engine.backward(loss)
        engine.step()

    for i in range(steps):
        train_step(i)
        if i == 0 and rank == 1 and CASE == "save":
            engine.save_checkpoint(os.path.join(OUT, "ckpt"), tag="one")
        if i == 0 and rank == 1 and CASE == "eval":
            engine.eval()
            with torch.no_grad():
                engine(x)
            engine.train()
    if CASE == "calm":
        try:
            engine.save_checkpoint(os.path.join(OUT, "ckpt"), tag=f"tag{rank}")
            result = "saved"
        except deepspeed.checkpoint.CheckpointError as err:
            result = f"CheckpointError: {err}"
        with open(os.path.join(OUT, f"rank{rank}.txt"), "w") as f:
            f.write(result)


if __name__ == "__main__":
    main()
