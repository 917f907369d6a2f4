"""The first seed's program (DeepSpeed getting-started), with `import dsfast as deepspeed`.

Checkpoint calls are left out until dsfast has checkpoints. Prints `RESULT <json>` on every rank.
"""
import argparse
import json

import torch

import dsfast as deepspeed


class Regression(torch.nn.Module):
    """A model whose forward takes the batch and returns the loss, as in the seed (`loss = model_engine(batch)`)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).float().squeeze(-1), y.float())


class Data(torch.utils.data.Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = self.x @ torch.randn(8, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
parser.add_argument("--epochs", type=int, default=3)
parser = deepspeed.add_config_arguments(parser)
cmd_args = parser.parse_args()

deepspeed.init_distributed()

torch.manual_seed(0)
model = Regression()
params = model.parameters()
model_engine, optimizer, data_loader, _ = deepspeed.initialize(args=cmd_args, model=model, model_parameters=params,
                                                              training_data=Data())
losses, seen = [], set()
for epoch in range(cmd_args.epochs):
    for step, batch in enumerate(data_loader):
        seen.update(round(float(v), 4) for v in batch[1])
        loss = model_engine(batch)
        model_engine.backward(loss)
        model_engine.step()
        losses.append(loss.item())
print("RESULT " + json.dumps({
    "rank": torch.distributed.get_rank(), "first": sum(losses[:4]) / 4, "last": sum(losses[-4:]) / 4,
    "steps": model_engine.global_steps, "skipped": model_engine.skipped_steps, "loss_scale": model_engine.loss_scale,
    "optimizer": type(optimizer).__name__, "model_dtype": str(next(model.parameters()).dtype),
    "samples_seen": sorted(seen)}), flush=True)
