"""Runs shared by the ZeRO workers (2 and 4 gloo ranks) and their one-process stage-0 references.

A run is "name:stage:precision:offload:gas:clip:steps:model:optimizer:inject_rank[:inject[:backward[:comm[:bucket]]]]",
model "plain" (dp_common's
MLP: 1928 parameters, not divisible by 4 x 16, so partitions are padded and parameters straddle shards) or
"fancy" (a frozen first layer, a tied weight, two param groups: weight decay 0.1 on matrices, 0 on biases and
norms, and a larger lr on the second group) or "reuse" / "reuse32" (Reuse: a layer of hidden size 1024 / 32 used
inside a reentrant activation checkpoint and again outside it: two gradients in one backward, the second after
its bucket may have been reduced) or "swapped" (layers registered in the reverse of the order forward uses them:
gradients arrive in the reverse of bucket order); optimizer "config" (AdamW from the config: CPUAdam) or "adam" (the
config's "Adam" with adam_w_mode false) or "sgd" (SGD with momentum from the config: CPUSGD) or "nesterov" (the
same with nesterov) or "client" (a torch.optim.AdamW instance) or "torch_adam" (a torch.optim.Adam instance) or
"fused_adam" (a dsfast FusedAdam(adam_w_mode=False) instance: on CPU tensors its reference kernel, through the
same step call a GPU makes). inject: "inf" (default: the loss times inf on inject_rank at step 1) or "huge" (times
1e22: finite gradients whose squares overflow fp32). backward: "engine" (default: engine.backward(loss)) or "plain"
(loss.backward(), DeepSpeed 0.19.8's hooks on the engine's outputs) or "twice" (two engine.backward calls per
micro-step, on the two halves of the micro-batch's loss: DeepSpeed accumulates both). comm: the config's communication_data_type
("-" or absent: not set). bucket: zero_optimization.reduce_bucket_size (absent: the default). precision "bf16m": bf16 with bf16 masters and optimizer states
(bf16_master_weights_and_grads + bf16_optimizer_states), "bf16mo": bf16 masters with fp32 states (offload only),
"fp16mo": fp16 with fp16 masters (fp16_master_weights_and_grads; offload only).
"""
import torch

from dp_common import D_HID, D_IN, D_OUT, MICRO, build_model, global_batch


class Reuse(torch.nn.Module):
    """`shared` runs inside a reentrant checkpoint and again after it: its gradient comes in two parts, the one
    from outside first, the checkpoint's (a nested backward) after `out`'s and possibly other buckets'."""

    def __init__(self, hidden):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.shared, self.out = (torch.nn.Linear(D_IN, hidden), torch.nn.Linear(hidden, hidden),
                                             torch.nn.Linear(hidden, D_OUT))

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        h = torch.tanh(self.embed(x))
        h = checkpoint(lambda t: torch.tanh(self.shared(t)), h, use_reentrant=True)
        return self.out(torch.tanh(self.shared(h)))


class Swapped(torch.nn.Module):
    """Registered last-used first: buckets (reverse registration order) complete in the reverse of their order."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(D_HID, D_OUT)
        self.mid = torch.nn.Linear(D_HID, D_HID)
        self.first = torch.nn.Linear(D_IN, D_HID)

    def forward(self, x):
        return self.head(torch.tanh(self.mid(torch.tanh(self.first(x)))))


MODELS = {"plain": build_model, "reuse": lambda: Reuse(1024), "reuse32": lambda: Reuse(32), "swapped": Swapped}


class Fancy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.frozen = torch.nn.Linear(D_IN, D_IN)
        self.frozen.requires_grad_(False)
        self.l1 = torch.nn.Linear(D_IN, D_HID)
        self.norm = torch.nn.LayerNorm(D_HID)
        self.l2 = torch.nn.Linear(D_HID, D_HID)
        self.l3 = torch.nn.Linear(D_HID, D_HID)
        self.l3.weight = self.l2.weight          # tied
        self.head = torch.nn.Linear(D_HID, D_OUT)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.norm(self.l1(torch.tanh(self.frozen(x)))))
        h = torch.nn.functional.gelu(self.l2(h))
        return self.head(torch.tanh(self.l3(h)))


def parse(run):
    f = run.split(":")
    return dict(name=f[0], stage=int(f[1]), precision=f[2], offload=f[3] == "1", gas=int(f[4]), clip=float(f[5]),
                steps=int(f[6]), model=f[7], optimizer=f[8], inject_rank=int(f[9]),
                inject=f[10] if len(f) > 10 else "inf", backward=f[11] if len(f) > 11 else "engine",
                comm=f[12] if len(f) > 12 and f[12] != "-" else None, bucket=int(f[13]) if len(f) > 13 else None)


def build(spec):
    model = Fancy() if spec["model"] == "fancy" else MODELS[spec["model"]]()
    if spec["model"] == "fancy":
        decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() > 1]
        rest = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() <= 1]
        params = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0, "lr": 2e-2}]
    else:
        params = [p for p in model.parameters()]
    return model, params


def config(spec, world):
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": spec["gas"],
           "train_batch_size": MICRO * spec["gas"] * world, "gradient_clipping": spec["clip"],
           "steps_per_print": 1000, "zero_optimization": {"stage": spec["stage"]}}
    if spec["optimizer"] == "config":
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}}
    elif spec["optimizer"] == "adam":
        cfg["optimizer"] = {"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.1, "adam_w_mode": False}}
    elif spec["optimizer"] in ("sgd", "nesterov"):
        cfg["optimizer"] = {"type": "SGD", "params": {"lr": 5e-2, "momentum": 0.9, "weight_decay": 0.01,
                                                      "nesterov": spec["optimizer"] == "nesterov"}}
    if spec["offload"]:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        # a client optimizer under offload: allowed explicitly, as DeepSpeed requires
        cfg["zero_force_ds_cpu_optimizer"] = spec["optimizer"] not in ("client", "torch_adam", "fused_adam")
    if spec.get("bucket"):
        cfg["zero_optimization"]["reduce_bucket_size"] = spec["bucket"]
    if spec.get("comm"):
        cfg["communication_data_type"] = spec["comm"]
    if spec["precision"] in ("bf16", "bf16m", "bf16mo"):
        cfg["bf16"] = {"enabled": True, "check_grad_overflow": spec["inject_rank"] >= 0}
        if spec["precision"] != "bf16":
            cfg["bf16"].update(bf16_master_weights_and_grads=True,
                               bf16_optimizer_states=spec["precision"] == "bf16m")
    if spec["precision"] in ("fp16", "fp16mo"):
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1,
                       "fp16_master_weights_and_grads": spec["precision"] == "fp16mo"}
    return cfg


def client_optimizer(kind, params):
    if kind == "client":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    if kind == "torch_adam":
        return torch.optim.Adam(params, lr=1e-2, weight_decay=0.1)
    if kind == "fused_adam":
        from dsfast.optim import FusedAdam
        return FusedAdam(params, lr=1e-2, weight_decay=0.1, adam_w_mode=False)
    return None


def make_engine(initialize, spec, world, **init_kw):
    model, params = build(spec)
    client = client_optimizer(spec["optimizer"], params)
    # with a client optimizer, a client LR scheduler too (built on engine.optimizer: the flat shards at ZeRO)
    schedule = (lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))) if client else None
    return initialize(model=model, model_parameters=params, optimizer=client, lr_scheduler=schedule,
                      config=config(spec, world), **init_kw)[0]


def train(initialize, spec, rank, world, engine=None, first=0, **init_kw):
    """Train `spec` on this rank's share of each global batch, steps [first, spec["steps"]); returns (losses,
    engine). With world == 1 and GAS = gas x world it is the one-process reference of the same global batch."""
    engine = engine or make_engine(initialize, spec, world, **init_kw)
    return run_steps(engine, spec, rank, world, first), engine


def run_steps(engine, spec, rank, world, first=0, after_step=None):
    """The training loop the ZeRO workers share: the global batch of step s split over ranks and micro-steps, an
    fp16 overflow injected on spec["inject_rank"] at step 1; after_step(engine, x) runs after every step."""
    gas = engine.gradient_accumulation_steps()
    losses = []
    for step in range(first, spec["steps"]):
        x, y = global_batch(step, MICRO * gas * world)
        total = 0.0
        for i in range(gas):
            lo = (i * world + rank) * MICRO
            if spec.get("backward") == "twice":   # mean over the micro-batch = half + half
                half = MICRO // 2
                parts = [torch.nn.functional.mse_loss(engine(x[a:a + half]).float(), y[a:a + half]) / 2
                         for a in (lo, lo + half)]
                for part in parts:
                    engine.backward(part)
                engine.step()
                total += float(sum(p.detach() for p in parts))
                continue
            loss = torch.nn.functional.mse_loss(engine(x[lo:lo + MICRO]).float(), y[lo:lo + MICRO])
            if step == 1 and rank == spec["inject_rank"]:
                loss = loss * (1e22 if spec.get("inject") == "huge" else float("inf"))
            if spec.get("backward") == "plain":
                (engine.scale(loss) if spec["precision"].startswith("fp16") else loss).backward()
            else:
                engine.backward(loss)
            engine.step()
            total += float(loss.detach())
        losses.append(total / gas)
        if after_step is not None:
            after_step(engine, x)
    return losses


def full_params(engine):
    """Every trained parameter's full fp32 master by name (a collective under ZeRO), frozen ones as they are."""
    from dsfast.utils import safe_get_full_fp32_param
    out = {}
    for name, p in engine.module.named_parameters():
        full = safe_get_full_fp32_param(p)
        out[name] = (full if full is not None else p.detach().float()).clone()
    return out


def compare_to_reference(ranks, want, want_losses, atol, rtol):
    """Every rank's final parameters equal the reference's (`want`: name -> tensor) within atol/rtol and are
    identical across ranks; returns (mean loss over ranks per step, the reference's losses)."""
    for r in ranks:
        assert set(r["params"]) == set(want)
        for name in want:
            torch.testing.assert_close(r["params"][name], want[name], atol=atol, rtol=rtol, msg=name)
    for name in want:   # every rank holds (or assembles) the same parameters
        for r in ranks[1:]:
            assert torch.equal(r["params"][name], ranks[0]["params"][name]), name
    mean_losses = [sum(r["losses"][s] for r in ranks) / len(ranks) for s in range(len(want_losses))]
    return mean_losses, want_losses
