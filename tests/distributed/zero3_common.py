"""Runs shared by the ZeRO stage 3 workers (2 and 4 gloo ranks) and their one-process stage-0 references.

A run is "name:precision:offload_optimizer:offload_param:gas:clip:steps:model:optimizer:inject_rank:threshold"
(threshold: param_persistence_threshold; 0 partitions every parameter), optionally ":bucket" (reduce_bucket_size).
Models: "plain" and "fancy" from zero_common (frozen layer, tied weight, two param groups), and "awkward": a module
called twice in one forward, a parameter read outside its module's forward (the root reads the embedding's weight
as its head), reentrant and non-reentrant activation checkpointing, and an eval forward under torch.no_grad()
after every step; "inplace" (BuiltInPlace: a parent changing its children's parameters in __init__); "reuse"
(a layer inside a reentrant checkpoint and outside it). Runs named
init* build the model under dsfast.zero.Init.
"""
import torch
from torch.utils.checkpoint import checkpoint

from dp_common import D_HID, D_IN, D_OUT, MICRO, build_model
from zero_common import Fancy, run_steps


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(D_HID, D_HID)
        self.norm = torch.nn.LayerNorm(D_HID)

    def forward(self, h):
        return h + torch.tanh(self.fc(self.norm(h)))


class Awkward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(D_IN, D_HID, bias=False)
        self.shared = torch.nn.Linear(D_HID, D_HID)       # called twice per forward
        self.ckpt_reentrant = Block()
        self.ckpt_plain = Block()
        self.out = torch.nn.Linear(D_IN, D_OUT)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.embed(x))
        h = torch.tanh(self.shared(h))
        h = checkpoint(self.ckpt_reentrant, h, use_reentrant=True)
        h = checkpoint(self.ckpt_plain, h, use_reentrant=False)
        h = torch.tanh(self.shared(h))
        back = h @ self.embed.weight          # the embedding's weight, outside the embedding's forward
        return self.out(back)


class Reuse(torch.nn.Module):
    """A layer used inside a reentrant checkpoint and again outside it: its gradient is accumulated twice in one
    backward (the checkpoint's nested backward and the outer one), so a stage-3 hook sees it twice."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(D_IN, D_HID)
        self.shared = torch.nn.Linear(D_HID, D_HID)
        self.out = torch.nn.Linear(D_HID, D_OUT)

    def forward(self, x):
        h = torch.tanh(self.embed(x))
        h = checkpoint(lambda t: torch.tanh(self.shared(t)), h, use_reentrant=True)
        return self.out(torch.tanh(self.shared(h)))


class BuiltInPlace(torch.nn.Module):
    """A model whose __init__ changes its children's parameters after building them (as GPT code does): an
    apply() re-initialisation, a loop over named_parameters() scaling some, and a weight tied in __init__."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(D_IN, D_HID)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(2)])
        self.a = torch.nn.Linear(D_HID, D_HID)
        self.b = torch.nn.Linear(D_HID, D_HID)
        self.b.weight = self.a.weight
        self.head = torch.nn.Linear(D_IN, D_OUT)
        self.scale = torch.nn.Parameter(torch.ones(D_HID))
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("fc.weight"):
                p.data.mul_(0.5)

    @staticmethod
    def _init(m):
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=0.2)
            if m.bias is not None:
                torch.nn.init.uniform_(m.bias, -0.1, 0.1)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        for blk in self.blocks:
            h = blk(h)
        h = torch.tanh(self.b(torch.tanh(self.a(h)))) * self.scale
        return self.head(h @ self.inp.weight)


def parse(run):
    f = run.split(":")
    return dict(name=f[0], precision=f[1], offload=f[2] == "1", offload_param=f[3] == "1", gas=int(f[4]),
                clip=float(f[5]), steps=int(f[6]), model=f[7], optimizer=f[8], inject_rank=int(f[9]),
                threshold=int(f[10]), stage=3, bucket=int(f[11]) if len(f) > 11 else 0,
                prefetch=int(f[12]) if len(f) > 12 else None)


def build(spec):
    model = {"plain": build_model, "fancy": Fancy, "awkward": Awkward, "inplace": BuiltInPlace,
             "reuse": Reuse}[spec["model"]]()
    if spec["model"] == "fancy":
        decay = [p for p in model.parameters() if p.requires_grad and p.dim() > 1]
        rest = [p for p in model.parameters() if p.requires_grad and p.dim() <= 1]
        return model, [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0, "lr": 2e-2}]
    return model, list(model.parameters())


def config(spec, world):
    zero = {"stage": spec["stage"]}
    if spec["stage"] == 3:
        zero["param_persistence_threshold"] = spec["threshold"]
        if spec["offload_param"]:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if spec.get("bucket"):
        zero["reduce_bucket_size"] = spec["bucket"]
    if spec.get("prefetch") is not None:
        zero["stage3_prefetch_bucket_size"] = spec["prefetch"]
    if spec["offload"]:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": spec["gas"],
           "train_batch_size": MICRO * spec["gas"] * world, "gradient_clipping": spec["clip"],
           "steps_per_print": 1000, "zero_optimization": zero}
    if spec["optimizer"] == "client":     # a torch optimizer under offload: allowed explicitly, as in DeepSpeed
        cfg["zero_force_ds_cpu_optimizer"] = False
    if spec["optimizer"] == "config":
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}
    elif spec["optimizer"] == "sgd":
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": 5e-2, "momentum": 0.9, "weight_decay": 0.01}}
    if spec["precision"] == "bf16":
        cfg["bf16"] = {"enabled": True}
    if spec["precision"] == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1}
    return cfg


def train(initialize, spec, rank, world, on_step=None, **init_kw):
    """Train on this rank's share of each global batch (world 1 with GAS x world: the reference)."""
    if spec["name"].startswith("init") and spec["stage"] == 3:   # built under dsfast.zero.Init
        import dsfast
        with dsfast.zero.Init(config_dict_or_path=config(spec, world)):
            model, params = build(spec)
        assert all(p.numel() == 0 for p in model.parameters())
    else:
        model, params = build(spec)
    client = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1) if spec["optimizer"] == "client" else None
    engine = initialize(model=model, model_parameters=params, optimizer=client, config=config(spec, world),
                        **init_kw)[0]

    def after_step(engine, x):
        if spec["model"] == "awkward":   # an eval forward under no_grad between steps: gathers, never reduces
            engine.eval()
            with torch.no_grad():
                engine(x[:MICRO])
            engine.train()
        if on_step is not None:
            on_step(engine)
    losses = run_steps(engine, spec, rank, world, after_step=after_step)
    return losses, engine
