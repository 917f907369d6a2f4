"""2 gloo ranks train with 8-bit host states (offload_optimizer.state_precision "int8", stage 2), save a checkpoint
and the full dequantized moments, for tests/test_engine_8bit_states.py's load at another world size and stage."""
import os
import sys

import torch

import dsfast
from dsfast.utils import safe_get_full_optimizer_state

out = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 300), torch.nn.GELU(), torch.nn.Linear(300, 8))
cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
       "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
       "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "state_precision": "int8"}}}
engine = dsfast.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0]
rank = int(os.environ["RANK"])
for i in range(3):
    g = torch.Generator().manual_seed(100 * rank + i)
    x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
    engine.backward(torch.nn.functional.mse_loss(engine(x), y))
    engine.step()
engine.save_checkpoint(out, tag="t")
moments = {(n, k): safe_get_full_optimizer_state(p, k).clone() for n, p in engine.module.named_parameters()
           for k in ("exp_avg", "exp_avg_sq")}
if rank == 0:
    torch.save(moments, os.path.join(out, "moments.pt"))
