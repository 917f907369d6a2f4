"""One rank of a program that makes the process group with torch itself (as Hugging Face's accelerate does on CPU),
then hands the model to dsfast.initialize and ends without destroying the group. An atexit hook registered before
initialize runs after dsfast's: it reports whether the group was already torn down by then."""
import atexit
import os

import torch
import torch.distributed as dist

atexit.register(lambda: print(f"AT_EXIT rank {os.environ['RANK']} initialized={dist.is_initialized()}", flush=True))
dist.init_process_group("gloo")
import dsfast  # noqa: E402

model = torch.nn.Linear(8, 4)
engine, *_ = dsfast.initialize(model=model, model_parameters=model.parameters(),
                               config={"train_batch_size": 4, "zero_optimization": {"stage": 2},
                                       "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}})
for _ in range(2):
    engine.backward(engine(torch.randn(2, 8)).square().mean())
    engine.step()
print("TRAINED", flush=True)
