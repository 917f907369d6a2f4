"""The engine's step through the optimizer contract (zero/step/decide.py + optim/amp_step.py), FusedAdam/FusedSGD on CPU
tensors (torch reference kernels) against torch's own optimizers.

Each case trains two engines built alike from the same seed: one with FusedAdam/FusedSGD, whose kernel applies the
decision (grad_scale, found_inf, clip_coef) and writes the 16-bit copies itself, one with torch.optim.AdamW/SGD,
which the generic form of the contract steps (scaled fp32 gradients, its own step(), then the copies). Over several
steps with clipping active and an injected overflow, params, masters, optimizer states, loss scale, skips and lr
must agree.
"""
import pytest
import torch

import dsfast
import dsfast.zero.step.decide as decide_module
from dsfast.optim import FusedAdam, FusedSGD

MICRO = 4
OVERFLOW_STEP = 2
SCHED = {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 1e-2}}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(i):
    g = torch.Generator().manual_seed(i)
    return torch.randn(MICRO, 8, generator=g), torch.randn(MICRO, 4, generator=g)


def make_engine(precision, opt_name, clip, gas=1, reduce_factor=None, torch_optimizer=False):
    model = make_model()
    if torch_optimizer:
        opt = (torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1) if opt_name == "adam"
               else torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, weight_decay=0.01))
    else:
        opt = (FusedAdam(model.parameters(), lr=1e-2, weight_decay=0.1) if opt_name == "adam"
               else FusedSGD(model.parameters(), lr=1e-2, momentum=0.9, weight_decay=0.01))
    cfg = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas, "steps_per_print": 1000,
           "gradient_clipping": clip, "scheduler": SCHED}
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "hysteresis": 1, "loss_scale_window": 2}
    elif precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    engine, _, _, sched = dsfast.initialize(model=model, optimizer=opt, model_parameters=model.parameters(),
                                            config=cfg, dist_init_required=False)
    if reduce_factor is not None:  # what a 1/world all-reduce average leaves to the step (world > 1)
        # (an internal on purpose: one process stands in for a world of several, which no protocol member sets)
        engine.state_owner.grad_sync.post_reduce_factor = reduce_factor
    return engine, opt


def train(engine, steps, overflow_at, gas=1):
    """Per-step record of what DeepSpeed semantics expose; the overflow is injected at step `overflow_at`."""
    record = []
    for step in range(steps):
        for micro in range(gas):
            x, y = batch(10 * step + micro)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss * float("inf") if step == overflow_at else loss)
            engine.step()
        record.append((engine.was_step_applied(), engine.skipped_steps, engine.global_steps, engine.loss_scale,
                       engine.get_lr(), engine.get_global_grad_norm()))
    return record


def state_tensors(engine, opt):
    out = [p.detach().clone() for p in engine.module.parameters()]
    masters = [m for g in opt.param_groups for m in g["params"]]   # stage 0 steps the fp32 masters
    out += [m.detach().clone() for m in masters]
    for m in masters:
        out += [v.clone() for _, v in sorted(opt.state[m].items()) if torch.is_tensor(v)]
    return out


# fp32 has no overflow check (as DeepSpeed), so an inf there would reach the weights on both paths: no injection.
# reduce_factor 0.5: the grads carry a 1/world factor even without a loss scale (SGD shows a wrong scale; Adam
# is nearly blind to one).
CASES = [("fp32", "adam", 0.05, None, None), ("fp32", "sgd", 0.05, None, None), ("fp32", "adam", 0.0, None, None),
         ("fp32", "sgd", 0.0, None, 0.5), ("fp32", "sgd", 0.05, None, 0.5),
         ("bf16", "adam", 0.05, OVERFLOW_STEP, None), ("bf16", "sgd", 0.0, OVERFLOW_STEP, 0.5),
         ("fp16", "adam", 0.05, OVERFLOW_STEP, None), ("fp16", "adam", 0.0, OVERFLOW_STEP, None),
         ("fp16", "sgd", 0.05, OVERFLOW_STEP, None), ("fp16", "sgd", 0.0, OVERFLOW_STEP, 0.5)]


@pytest.mark.parametrize("precision,opt_name,clip,overflow_at,reduce_factor", CASES)
def test_fused_kernels_match_torch_optimizers_through_the_contract(precision, opt_name, clip, overflow_at,
                                                                   reduce_factor):
    steps, gas = 5, 2
    fused, fused_opt = make_engine(precision, opt_name, clip, gas, reduce_factor)
    fused_record = train(fused, steps, overflow_at, gas)
    sync, sync_opt = make_engine(precision, opt_name, clip, gas, reduce_factor, torch_optimizer=True)
    sync_record = train(sync, steps, overflow_at, gas)

    for step, (a, b) in enumerate(zip(fused_record, sync_record)):
        assert a[:5] == b[:5], f"step {step}: applied/skipped/global_steps/loss_scale/lr differ: {a} vs {b}"
        if b[5] is None:
            assert a[5] is None
        else:  # one decision, over the same buckets
            assert a[5] == pytest.approx(b[5], rel=1e-6)
    if overflow_at is not None:
        assert not fused_record[overflow_at][0] and fused.skipped_steps == 1
    if clip:  # clipping was active, not just configured
        assert all(r[5] is not None for r in fused_record)
        assert max(r[5] for r in fused_record if r[0]) > clip
    # The kernel applies 1/scale and the clip coefficient as two fp32 multiplies where the generic form folds
    # them into one, and torch orders Adam's arithmetic its own way: a few fp32 ulps apart on the masters; the
    # half-precision model copy may then round to the neighbouring value (one 16-bit ulp).
    half = {"fp16": 1e-3, "bf16": 8e-3}.get(precision, 1e-6)
    for x, y in zip(state_tensors(fused, fused_opt), state_tensors(sync, sync_opt)):
        tol = 2e-6 if x.dtype == torch.float32 else half
        torch.testing.assert_close(x, y, rtol=tol, atol=tol)
        assert torch.isfinite(x).all()


class HostReads:
    """Counts Python-level reads of tensor values to the host (item/bool/float/int/tolist) outside optimizer.step
    (the CPU reference kernels read scalars by design; on CUDA the native kernels don't)."""
    METHODS = ("item", "__bool__", "__float__", "__int__", "tolist", "__index__")

    def __init__(self, monkeypatch, optimizer):
        self.reads = []
        self.in_optimizer = False
        self.queued = False
        for name in self.METHODS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(name, original))
        step = optimizer.step

        def wrapped_step(*args, **kwargs):
            self.in_optimizer = True
            try:
                return step(*args, **kwargs)
            finally:
                self.in_optimizer, self.queued = False, True
        monkeypatch.setattr(optimizer, "step", wrapped_step)

    def _counting(self, name, original):
        def method(tensor, *args, **kwargs):
            if not self.in_optimizer:
                self.reads.append((name, "after" if self.queued else "before", tuple(tensor.shape)))
            return original(tensor, *args, **kwargs)
        return method


@pytest.mark.parametrize("precision,clip,reads_after", [
    ("fp32", 0.05, 0), ("fp32", 0.0, 0), ("bf16", 0.05, 1), ("fp16", 0.05, 1), ("fp16", 0.0, 1)])
def test_step_reads_nothing_before_the_optimizer_is_queued(monkeypatch, precision, clip, reads_after):
    # the decision as on a GPU (float64 accumulation, no redo on the host); on CPU tensors it may read its norms
    monkeypatch.setattr(decide_module, "exact_on_device", lambda device: True)
    engine, opt = make_engine(precision, "adam", clip)
    x, y = batch(0)
    engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
    counter = HostReads(monkeypatch, opt)
    engine.step()
    reads = counter.reads
    monkeypatch.undo()
    assert counter.queued and engine.was_step_applied()
    assert [r for r in reads if r[1] == "before"] == []
    # the overflow flag, after the kernel is queued, only where the precision checks for overflow
    assert reads == [("__bool__", "after", ())] * reads_after
    if clip:  # the norm is read only when asked for
        assert engine.get_global_grad_norm() > 0
