"""The first seed's program (DeepSpeed getting-started), with `import dsfast as deepspeed`.

The seed's checkpoint loop: load `latest` from --load_dir (when given), skip the steps it already did, save every
--save_interval steps with `client_sd['step']` and a float tag from the loss. One change: the tag is the loss
averaged over the ranks (the seed's per-rank `loss.item()` differs between ranks, which dsfast refuses with an
error naming both tags rather than writing a broken checkpoint). Prints `RESULT <json>` on every rank.
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
parser.add_argument("--load_dir", default=None)
parser.add_argument("--ckpt_id", default=None)
parser.add_argument("--save_dir", default=None)
parser.add_argument("--save_interval", type=int, default=10)
parser = deepspeed.add_config_arguments(parser)
cmd_args = parser.parse_args()

deepspeed.init_distributed()

torch.manual_seed(0)
model = Regression()
params = model.parameters()
model_engine, optimizer, data_loader, _ = deepspeed.initialize(args=cmd_args, model=model, model_parameters=params,
                                                              training_data=Data())
client_sd, start = {}, 0
if cmd_args.load_dir:
    _, client_sd = model_engine.load_checkpoint(cmd_args.load_dir, cmd_args.ckpt_id)
    client_sd = client_sd or {}
    start = client_sd.get("step", -1) + 1
losses, seen, saved = [], set(), []
step = 0
for epoch in range(cmd_args.epochs):
    for batch in data_loader:
        if step < start:          # advance the data loader to the checkpoint's step
            step += 1
            continue
        seen.update(round(float(v), 4) for v in batch[1])
        loss = model_engine(batch)
        model_engine.backward(loss)
        model_engine.step()
        losses.append(loss.item())
        if cmd_args.save_dir and step % cmd_args.save_interval == 0:
            client_sd["step"] = step
            mean = loss.detach().float().clone()
            torch.distributed.all_reduce(mean)
            ckpt_id = round(mean.item() / torch.distributed.get_world_size(), 4)
            model_engine.save_checkpoint(cmd_args.save_dir, ckpt_id, client_sd=client_sd)
            saved.append(ckpt_id)
        step += 1
print("RESULT " + json.dumps({
    "rank": torch.distributed.get_rank(), "first": sum(losses[:4]) / 4, "last": sum(losses[-4:]) / 4,
    "start": start, "saved": saved, "zero_stage": model_engine.zero_optimization_stage(),
    "steps": model_engine.global_steps, "skipped": model_engine.skipped_steps, "loss_scale": model_engine.loss_scale,
    "optimizer": type(optimizer).__name__, "model_dtype": str(next(model.parameters()).dtype),
    "samples_seen": sorted(seen)}), flush=True)
