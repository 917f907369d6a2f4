"""A CIFAR-10 training program written the way DeepSpeed's public example is (DeepSpeedExamples
training/cifar/cifar10_deepspeed.py): `import deepspeed`, the accelerator abstraction, deepspeed.comm, the MoE
parameter-group helper at the top, deepspeed.initialize with training_data. Random images instead of the CIFAR
download. It is run with `deepspeed` pointing at dsfast (tests/distributed/deepspeed_shim.py).

Rank 0 writes --out: per-epoch mean loss over all ranks, and whether every rank ended with the same weights.
"""
import argparse
import json

import deepspeed
import deepspeed.comm as dist
import torch
import torch.nn as nn
import torch.nn.functional as F
from deepspeed.accelerator import get_accelerator
from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer


def add_argument():
    parser = argparse.ArgumentParser(description="CIFAR")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("-e", "--epochs", default=6, type=int, help="number of total epochs")
    parser.add_argument("--dtype", default="fp32", type=str, choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--stage", default=0, type=int, choices=[0, 1, 2, 3])
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


class RandomCifar(torch.utils.data.Dataset):
    """64 fixed 3x32x32 images with fixed labels (the same on every rank): a set the net can fit."""

    def __init__(self, n=64):
        g = torch.Generator().manual_seed(2024)
        self.images = torch.randn(n, 3, 32, 32, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def create_moe_param_groups(model):
    parameters = {"params": [p for p in model.parameters()], "name": "parameters"}
    return split_params_into_different_moe_groups_for_optimizer(parameters)


def get_ds_config(args):
    return {
        "train_batch_size": 16,
        "steps_per_print": 2000,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.8, 0.999], "eps": 1e-8,
                                                 "weight_decay": 3e-7}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                     "warmup_num_steps": 10}},
        "gradient_clipping": 1.0,
        "prescale_gradients": False,
        "bf16": {"enabled": args.dtype == "bf16"},
        "fp16": {"enabled": args.dtype == "fp16", "fp16_master_weights_and_grads": False, "loss_scale": 0,
                 "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 15},
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": args.stage, "allgather_partitions": True, "reduce_scatter": True,
                              "allgather_bucket_size": 50000000, "reduce_bucket_size": 50000000,
                              "overlap_comm": True, "contiguous_gradients": True, "cpu_offload": False},
    }


def main(args):
    deepspeed.init_distributed()
    accel = get_accelerator()
    assert accel.is_available(), accel
    accel.manual_seed_all(1234)

    # the example's download guard: rank 0 prepares the data while the others wait
    if dist.get_rank() != 0:
        dist.barrier()
    trainset = RandomCifar()
    if dist.get_rank() == 0:
        dist.barrier()

    torch.manual_seed(100 + dist.get_rank())   # rank-dependent init: initialize() must broadcast rank 0's weights
    net = Net()
    parameters = create_moe_param_groups(net)
    model_engine, optimizer, trainloader, __ = deepspeed.initialize(
        args=args, model=net, model_parameters=parameters, training_data=trainset, config=get_ds_config(args))

    local_device = accel.device_name(model_engine.local_rank)
    target_dtype = None
    if model_engine.bfloat16_enabled():
        target_dtype = torch.bfloat16
    elif model_engine.fp16_enabled():
        target_dtype = torch.half

    criterion = nn.CrossEntropyLoss()
    epoch_losses = []
    for epoch in range(args.epochs):
        total, steps = torch.zeros(1), 0
        for data in trainloader:
            inputs, labels = data[0].to(local_device), data[1].to(local_device)
            if target_dtype is not None:
                inputs = inputs.to(target_dtype)
            outputs = model_engine(inputs)
            loss = criterion(outputs.float(), labels)
            model_engine.backward(loss)
            model_engine.step()
            total += loss.detach().float().cpu()
            steps += 1
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        epoch_losses.append(total.item() / (steps * dist.get_world_size()))
        if dist.get_rank() == 0:
            print(f"[epoch {epoch}] mean loss {epoch_losses[-1]:.4f} on {local_device}", flush=True)
    accel.synchronize()

    flat = torch.cat([p.detach().float().reshape(-1).cpu() for p in model_engine.module.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    if dist.get_rank() == 0:
        result = {"losses": epoch_losses, "world_size": dist.get_world_size(), "steps_per_epoch": steps,
                  "max_weight_diff": max(float((g - flat).abs().max()) for g in gathered),
                  "weights_nonzero": bool(flat.abs().sum() > 0), "device": local_device,
                  "backend": accel.communication_backend_name(), "deepspeed_is": deepspeed.__name__,
                  "engine_type": type(model_engine).__module__}
        with open(args.out, "w") as f:
            json.dump(result, f)
    dist.barrier()


if __name__ == "__main__":
    main(add_argument())
