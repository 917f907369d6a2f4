"""Model, data and config shared by the data-parallel workers and their single-process references."""
import torch

MICRO = 4
D_IN, D_HID, D_OUT = 16, 32, 8


def build_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D_IN, D_HID), torch.nn.LayerNorm(D_HID), torch.nn.GELU(),
                               torch.nn.Linear(D_HID, D_HID), torch.nn.GELU(), torch.nn.Linear(D_HID, D_OUT))


class RankDependentSpare(torch.nn.Module):
    """The usual model plus a layer that only some ranks use (rank-dependent control flow in forward)."""

    def __init__(self, rank):
        super().__init__()
        self.net = build_model()
        self.spare = torch.nn.Linear(D_OUT, D_OUT)
        self.rank = rank

    def forward(self, x):
        out = self.net(x)
        return out + 0.1 * self.spare(out) if self.rank == 0 else out


def global_batch(step, size):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(size, D_IN, generator=g), torch.randn(size, D_OUT, generator=g)


def ds_config(precision, gas, world, clip, lr=1e-2):
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
           "train_batch_size": MICRO * gas * world,
           "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.1}},
           "gradient_clipping": clip, "steps_per_print": 1000}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}
        cfg["scheduler"] = {"type": "WarmupLR",
                            "params": {"warmup_num_steps": 10, "warmup_min_lr": lr / 2, "warmup_max_lr": lr}}
    return cfg


def torch_reference(steps, global_size, clip, lr=1e-2):
    """Plain PyTorch on the whole global batch: AdamW, clip_grad_norm_. Returns (params per step, norms)."""
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    params, norms = [], []
    for step in range(steps):
        x, y = global_batch(step, global_size)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))))
        opt.step()
        params.append([p.detach().clone() for p in model.parameters()])
    return params, norms


def gather_records(record):
    """Every rank's `record` (any picklable object), in rank order, on every rank."""
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, record)
    return gathered
