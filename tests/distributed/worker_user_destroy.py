"""A DeepSpeed-style program: a few ZeRO-3 steps on two gloo ranks, then the program's own last line,
torch.distributed.destroy_process_group(), and a plain exit (no dsfast teardown call)."""
import sys

import torch

import dsfast as deepspeed

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
config = {"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": int(sys.argv[1])}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for _ in range(3):
    loss = engine(torch.randn(4, 16)).pow(2).mean()
    engine.backward(loss)
    engine.step()
print("TRAINED", flush=True)
torch.distributed.destroy_process_group()
