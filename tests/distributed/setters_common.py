"""The check of dsfast.utils' safe_set_* setters shared by the in-process test (one rank) and the 2-rank worker:
after a step (so Adam's states exist) and a backward, set every parameter's fp32 master, gradient and both
moments to fresh values (the same on every rank), read them back, step, and compare with torch's AdamW stepping
those values."""
import torch

import dsfast
from dsfast.utils import (safe_get_full_fp32_param, safe_get_full_grad, safe_get_full_optimizer_state,
                          safe_get_local_fp32_param, safe_get_local_grad, safe_get_local_optimizer_state,
                          safe_set_full_fp32_param, safe_set_full_grad, safe_set_full_optimizer_state,
                          safe_set_local_fp32_param, safe_set_local_grad, safe_set_local_optimizer_state)

LR, WD, KEYS = 1e-2, 0.1, ("exp_avg", "exp_avg_sq")


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.GELU(), torch.nn.Linear(33, 8))


def config(stage, precision, offload):
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000, "gradient_clipping": 0.0,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
           "zero_optimization": {"stage": stage}}
    if offload:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def _backward(engine, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))


def new_values(shape, seed, grad_dtype):
    """Fresh master, gradient (exact in the gradient's dtype) and moments (exp_avg_sq > 0)."""
    g = torch.Generator().manual_seed(seed)
    return {"param": torch.randn(shape, generator=g), "grad": torch.randn(shape, generator=g).to(grad_dtype).float(),
            "exp_avg": torch.randn(shape, generator=g) * 0.1, "exp_avg_sq": torch.rand(shape, generator=g) * 0.01}


def torch_adamw(values):
    """torch's AdamW at its second step from the given master, gradient and moments."""
    p = torch.nn.Parameter(values["param"].clone())
    opt = torch.optim.AdamW([p], lr=LR, weight_decay=WD)
    opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": values["exp_avg"].clone(),
                    "exp_avg_sq": values["exp_avg_sq"].clone()}
    p.grad = values["grad"].clone()
    opt.step()
    return p.detach()


def run(stage, precision, offload, local=False):
    """[(name, what the setters' getters read back matched, stepped master, torch's)]; local: set each rank's
    piece with the local setters (cut from the same full values) instead of the full ones."""
    mdl = model()
    # (the 2-rank worker joined its group first; in one process no group is made, so none is left behind)
    engine = dsfast.initialize(model=mdl, model_parameters=mdl.parameters(), config=config(stage, precision, offload),
                               dist_init_required=False)[0]
    _backward(engine, 0)
    engine.step()
    _backward(engine, 1)
    grad_dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    named = list(engine.module.named_parameters())
    values = {n: new_values(tuple(safe_get_full_fp32_param(p).shape), i, grad_dtype) for i, (n, p) in enumerate(named)}
    for n, p in named:
        v = values[n]
        if local:
            _set_local_pieces(p, v)
        else:
            safe_set_full_fp32_param(p, v["param"])
            safe_set_full_grad(p, v["grad"])
            for k in KEYS:
                safe_set_full_optimizer_state(p, v[k], k)
    read_back = {n: all(torch.equal(get.float(), values[n][key]) for key, get in (
        ("param", safe_get_full_fp32_param(p)), ("grad", safe_get_full_grad(p)),
        ("exp_avg", safe_get_full_optimizer_state(p, "exp_avg")),
        ("exp_avg_sq", safe_get_full_optimizer_state(p, "exp_avg_sq")))) for n, p in named}
    engine.step()
    out = [(n, read_back[n], safe_get_full_fp32_param(p).clone(), torch_adamw(values[n])) for n, p in named]
    engine.destroy()
    return out


def _set_local_pieces(p, v):
    """This rank's piece of each full value, located by where the local getter's piece sits in the full one."""
    here = safe_get_local_fp32_param(p).detach().reshape(-1).clone()
    full = safe_get_full_fp32_param(p).reshape(-1)
    start = _offset_of(here, full)
    piece = {k: t.reshape(-1)[start:start + here.numel()] for k, t in v.items()}
    safe_set_local_fp32_param(p, piece["param"])
    safe_set_local_grad(p, piece["grad"])
    for k in KEYS:
        safe_set_local_optimizer_state(p, piece[k], k)
    assert torch.equal(safe_get_local_fp32_param(p).reshape(-1).float(), piece["param"])
    assert torch.equal(safe_get_local_grad(p).reshape(-1).float(), piece["grad"])
    for k in KEYS:
        assert torch.equal(safe_get_local_optimizer_state(p, k).reshape(-1).float(), piece[k])


def _offset_of(piece, full):
    """Where `piece` starts in `full` (the master's values are distinct floats, so the match is unique)."""
    if piece.numel() == 0:
        return 0
    for start in range(full.numel() - piece.numel() + 1):
        if torch.equal(full[start:start + piece.numel()], piece):
            return start
    raise AssertionError("the local piece is not a slice of the full parameter")
