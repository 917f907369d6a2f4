"""A rank started by Open MPI- or Slurm-style variables only: joins the group, checks it, then shows the error a
batch-size mismatch gives at this world size. Prints one line `RESULT <json>`."""
import json
import os

import torch
import torch.distributed as dist

import dsfast

backend = dsfast.init_distributed()
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
try:
    dsfast.initialize(model=torch.nn.Linear(2, 2),
                      config={"train_batch_size": 5, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 1})
    error = None
except Exception as err:  # the test checks the type and text
    error = f"{type(err).__name__}: {err}"
print("RESULT " + json.dumps({"backend": backend, "rank": dist.get_rank(), "world": dist.get_world_size(),
                              "sum": t.item(), "env_rank": os.environ.get("RANK"), "error": error}), flush=True)
