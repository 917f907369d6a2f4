"""managed_gradient_accumulation=false runs, shared by the 2-rank worker and the one-process tests, and their
plain-PyTorch reference.

As DeepSpeed 0.19.8 defines the mode: every engine.step() is the boundary and the caller decides how many
micro-batches it accumulates (COUNTS: 1, 3, 2 backwards before each step); each backward's loss is still divided by
gradient_accumulation_steps (GAS). The reference sums the global micro-batches' gradients / GAS and takes an SGD
step: exact in fp32 (no clipping, no momentum).
"""
import torch

from dp_common import MICRO, build_model, global_batch

COUNTS = (1, 3, 2)
GAS = 2
LR = 0.1


def config(stage, precision="fp32", offload=False, world=1):
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
           "train_batch_size": MICRO * GAS * world, "managed_gradient_accumulation": False,
           "gradient_clipping": 0.0, "steps_per_print": 1000, "zero_allow_untested_optimizer": True,
           "optimizer": {"type": "SGD", "params": {"lr": LR}},
           "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def micro_batches(rank, world):
    """[[this rank's (x, y) of each micro-batch of step s] for each step]."""
    out, i = [], 0
    for count in COUNTS:
        step = []
        for _ in range(count):
            x, y = global_batch(i, MICRO * world)
            step.append((x[rank * MICRO:(rank + 1) * MICRO], y[rank * MICRO:(rank + 1) * MICRO]))
            i += 1
        out.append(step)
    return out


def train(initialize, stage, precision="fp32", offload=False, rank=0, world=1):
    """Returns (engine, [boundary answers seen outside step()], [global_samples after each step])."""
    model = build_model()
    engine = initialize(model=model, model_parameters=model.parameters(),
                        config=config(stage, precision, offload, world))[0]
    seen, samples = [], []
    for step in micro_batches(rank, world):
        for x, y in step:
            engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
            seen.append(engine.is_gradient_accumulation_boundary())
        engine.step()
        samples.append(engine.global_samples)
    return engine, seen, samples


def reference(world):
    """Plain PyTorch on the global micro-batches: the weights after the steps."""
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    i = 0
    for count in COUNTS:
        opt.zero_grad()
        for _ in range(count):
            x, y = global_batch(i, MICRO * world)
            (torch.nn.functional.mse_loss(model(x), y) / GAS).backward()
            i += 1
        opt.step()
    return [p.detach().clone() for p in model.parameters()]
