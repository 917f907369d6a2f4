"""Shared by tests/test_overlap_step.py and tests/distributed/test_overlap_step_dp.py: a tiny model trained with
offload_optimizer.overlap_step on or off, and everything the two runs must agree on bit for bit."""
import os

import torch

import dsfast

DIM = 8


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4))


def config(stage, precision="fp32", overlap=True, clip=0.0, gas=1, scheduler=False, managed=True, world=1, nvme=None,
           buffers=3, param_nvme=None, param_buffers=2):
    """nvme: a directory: the optimizer states on NVMe there (a window of `buffers` buffers over the 5-6 units, of
    which the biases are small units outside the buffers: nvme/window.py). param_nvme (stage 3): a directory: every
    parameter's shard on NVMe there (max_in_cpu 0: the persistent biases too), a window of `param_buffers`."""
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas,
           "train_batch_size": 2 * gas * world,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
           "gradient_clipping": clip,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 100,
                                 "stage3_param_persistence_threshold": 20,
                                 "offload_optimizer": {"device": "cpu", "overlap_step": overlap}}}
    if nvme is not None:
        os.makedirs(nvme, exist_ok=True)
        cfg["zero_optimization"]["offload_optimizer"].update(device="nvme", nvme_path=str(nvme), buffer_count=buffers)
    if param_nvme is not None:
        os.makedirs(param_nvme, exist_ok=True)
        cfg["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": str(param_nvme),
                                                     "buffer_count": param_buffers, "max_in_cpu": 0}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 2}
    if scheduler:
        cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2,
                                                           "warmup_num_steps": 3}}
    if not managed:
        cfg["managed_gradient_accumulation"] = False
    return cfg


def batch(i, dtype=torch.float32, rank=0):
    g = torch.Generator().manual_seed(1000 * rank + i)
    return torch.randn(2, DIM, generator=g).to(dtype), torch.randn(2, 4, generator=g)


def engine(stage, **kw):
    m = model()
    eng, *_ = dsfast.initialize(model=m, model_parameters=m.parameters(), config=config(stage, **kw),
                                dist_init_required=False)
    return eng


def train(eng, steps, gas=1, overflow_at=None, rank=0, after_step=None):
    """steps optimizer steps of gas micro-batches each; the losses. overflow_at: the step whose loss is made inf
    (fp16: skipped). after_step(eng, step): right after each step() returns (what must read updated values)."""
    dtype = next(eng.module.parameters()).dtype
    losses = []
    for s in range(steps):
        for m in range(gas):
            x, y = batch(s * gas + m, dtype, rank)
            loss = torch.nn.functional.mse_loss(eng(x).float(), y)
            if s == overflow_at:
                loss = loss * float("inf")
            eng.backward(loss)
            losses.append(loss.item())
            eng.step()
        if after_step is not None:
            after_step(eng, s)
    return losses


def snapshot(eng):
    """Every parameter (model dtype), fp32 master and Adam state, and the counters: what must be bitwise equal."""
    params = list(eng.module.parameters())
    out = {"lr": eng.get_lr(), "steps": (eng.global_steps, eng.global_samples, eng.skipped_steps),
           "scale": eng.loss_scale}
    with dsfast.zero.GatheredParameters(params):
        out["module"] = [p.detach().clone() for p in params]
    out["master"] = [dsfast.utils.safe_get_full_fp32_param(p) for p in params]
    out["states"] = [dsfast.utils.safe_get_full_optimizer_state(p, k) for p in params
                     for k in ("exp_avg", "exp_avg_sq")]
    return out


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], list) and a[k] and torch.is_tensor(a[k][0]):
            assert len(a[k]) == len(b[k])
            for i, (x, y) in enumerate(zip(a[k], b[k])):
                assert torch.equal(x, y), f"{k}[{i}] differs: max |diff| {(x.float() - y.float()).abs().max()}"
        else:
            assert a[k] == b[k], k


def fail_second_group_step(optimizer, error=OSError("disk on fire")):
    """From now on the optimizer's second param-group step raises `error` (a failure inside the overlapped worker)."""
    own, calls = optimizer._step_group, []

    def failing(gi, group, *args):
        calls.append(gi)
        if len(calls) == 2:
            raise error
        return own(gi, group, *args)
    optimizer._step_group = failing
