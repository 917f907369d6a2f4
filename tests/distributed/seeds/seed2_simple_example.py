"""The second seed's program (a simple DeepSpeed example), with `import dsfast as deepspeed`.

Flow as in the seed: --local_rank declared by the script, parse_known_args, add_config_arguments when
--isDeepspeed, a trainable model with a client Adam optimizer, a frozen model initialized without one and used in
eval(), and a DataLoader with a DistributedSampler built by the script. One extra model (marked below) trains with
the config's own optimizer (SGD with momentum). Prints `RESULT <json>` on every rank.
"""
import argparse
import json

import torch
from torch.optim import Adam
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import dsfast as deepspeed


class Pairs(Dataset):
    def __init__(self, n=128):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 6, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], i


class Trainer:
    def __init__(self, args):
        self.args = args
        torch.manual_seed(0)
        self.teacher = torch.nn.Linear(6, 3)
        for p in self.teacher.parameters():  # frozen: no trainable parameters
            p.requires_grad_(False)
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        self.plain = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

        # trainable model
        self.optimizer = Adam(self.model.parameters(), lr=1e-2)
        self.model, *_ = deepspeed.initialize(args=self.args, model=self.model,
                                              model_parameters=self.model.parameters(), optimizer=self.optimizer)
        # frozen model
        self.teacher, *_ = deepspeed.initialize(args=self.args, model=self.teacher)
        self.teacher.eval()
        # extra (not in the seed): the config's SGD optimizer
        self.plain, self.plain_opt, _, _ = deepspeed.initialize(args=self.args, model=self.plain,
                                                                model_parameters=self.plain.parameters())

    def train(self, epochs):
        dataset = Pairs()
        if self.args.isDeepspeed:
            loader = DataLoader(dataset, self.model.train_micro_batch_size_per_gpu(),
                                sampler=DistributedSampler(dataset, shuffle=True), num_workers=1, pin_memory=True,
                                drop_last=True)
        else:
            loader = DataLoader(dataset, 2, shuffle=True, drop_last=True)
        losses, plain_losses, indices = [], [], []
        for epoch in range(epochs):
            loader.sampler.set_epoch(epoch)
            for x, idx in loader:
                indices += idx.tolist()
                with torch.no_grad():
                    target = self.teacher(x)
                for engine, sink in ((self.model, losses), (self.plain, plain_losses)):
                    loss = torch.nn.functional.mse_loss(engine(x), target)
                    engine.backward(loss)
                    engine.step()
                    sink.append(loss.item())
        return losses, plain_losses, indices


parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
parser.add_argument("--isDeepspeed", action="store_true")
args, _ = parser.parse_known_args()
if args.isDeepspeed:
    parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

trainer = Trainer(args)
losses, plain_losses, indices = trainer.train(epochs=2)
print("RESULT " + json.dumps({
    "rank": torch.distributed.get_rank(), "optimizer": type(trainer.model.optimizer).__name__,
    "plain_optimizer": type(trainer.plain_opt).__name__, "teacher_optimizer": repr(trainer.teacher.optimizer),
    "teacher_training": trainer.teacher.module.training,
    "first": sum(losses[:4]) / 4, "last": sum(losses[-4:]) / 4,
    # epoch means: the seed's SGD (lr 1e-3) moves slowly, so compare whole epochs, not single batches
    "plain_first": sum(plain_losses[:len(plain_losses) // 4]) / (len(plain_losses) // 4),
    "plain_last": sum(plain_losses[-(len(plain_losses) // 4):]) / (len(plain_losses) // 4),
    "indices_epoch0": sorted(indices[:len(indices) // 2])}), flush=True)
