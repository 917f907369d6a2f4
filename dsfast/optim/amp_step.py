"""The one optimizer contract the engine and ZeRO step through, for every optimizer.

    amp_step(optimizer, grads=, grad_scale=, found_inf=, clip_coef=, out16=)

  grads       per param group, one gradient per param (None: read p.grad). Lets a 16-bit gradient shard be read
              in place by an fp32 master (torch refuses a .grad of another dtype).
  grad_scale  the scale the gradients carry (1 / (1/world x 1/loss_scale)); divided out. A tensor or a number.
  found_inf   nonzero: skip the whole step, step counts included (the caller decided it for every rank).
  clip_coef   multiplies the unscaled gradients (the global-norm clip).
  out16       per param group, one 16-bit tensor per param receiving the updated value in the same pass.

It is torch's `_step_supports_amp_scaling` shape (what GradScaler hands fused optimizers), extended by grads/out16.
dsfast's optimizers (CPUAdam, CPUSGD, CPUAdagrad, CPULion, FusedAdam, FusedSGD) implement it in their kernels and
say so with `_dsfast_amp_step`; any other torch optimizer gets the generic form here: skip on the host, one scaled
fp32 gradient per param, its own step(), then the 16-bit copies. Nobody else reads or creates optimizer.state.

The per-unit entry (ZeRO steps shard units through it, all at once in memory or a few at a time from NVMe):

    step = prepare_step(optimizer, grad_scale=, found_inf=, clip_coef=)   # hyperparameters validated here, once
    step(parts)   # parts: per param group, (indices into its params, their gradients, their 16-bit outputs or None)

Calling step() once with every parameter is amp_step(); calling it once per batch of units gives each parameter
the same update when the optimizer is element-wise (optim/element_wise.py). dsfast's CPU optimizers implement it
with `prepare_amp_step`; any other optimizer is stepped through amp_step, its param groups narrowed to the batch
for the call when the batch is not all of them.
"""
import torch


def takes_amp_step(optimizer):
    return bool(getattr(optimizer, "_dsfast_amp_step", False))


def amp_step(optimizer, *, grads=None, grad_scale=None, found_inf=None, clip_coef=None, out16=None):
    if takes_amp_step(optimizer):
        optimizer.step(grads=grads, grad_scale=grad_scale, found_inf=found_inf, clip_coef=clip_coef, out16=out16)
        return
    _generic_step(optimizer, grads, grad_scale, found_inf, clip_coef, out16)


def prepare_step(optimizer, *, grad_scale=None, found_inf=None, clip_coef=None):
    """The per-unit entry: step(parts) applies this step's update to the parameters named in parts."""
    prepare = getattr(optimizer, "prepare_amp_step", None)
    if prepare is not None:
        return prepare(grad_scale=grad_scale, found_inf=found_inf, clip_coef=clip_coef)
    return _NarrowedStep(optimizer, dict(grad_scale=grad_scale, found_inf=found_inf, clip_coef=clip_coef))


class _NarrowedStep:
    """amp_step over a batch of an optimizer without its own per-unit entry: the whole step when the batch names
    every parameter in order, else its param groups hold only the batch's parameters for the call (one unit's step
    then costs the same whatever the number of parameters)."""

    def __init__(self, optimizer, kwargs):
        self.optimizer, self.kwargs = optimizer, kwargs

    def __call__(self, parts):
        groups = self.optimizer.param_groups
        grads = [g for _, g, _ in parts]
        out16 = None if all(o is None for _, _, o in parts) else [o for _, _, o in parts]
        if all(list(idx) == list(range(len(g["params"]))) for (idx, _, _), g in zip(parts, groups)):
            amp_step(self.optimizer, grads=grads, out16=out16, **self.kwargs)
            return
        kept = [g["params"] for g in groups]
        try:
            for g, (idx, _, _) in zip(groups, parts):
                g["params"] = [g["params"][j] for j in idx]
            amp_step(self.optimizer, grads=grads, out16=out16, **self.kwargs)
        finally:
            for g, params in zip(groups, kept):
                g["params"] = params


def host_multiplier(grad_scale, found_inf, clip_coef):
    """What a host-side kernel multiplies the gradients by (1/grad_scale x clip_coef, in float64), or None when
    found_inf says skip. Reads the scalars (free on CPU tensors; a device sync otherwise, which a CPU optimizer
    stepping device-decided gradients needs anyway)."""
    if found_inf is not None and float(found_inf) != 0.0:
        return None
    m = 1.0
    if grad_scale is not None:
        m = 1.0 / float(grad_scale)
    if clip_coef is not None:
        m *= float(clip_coef)
    return m


@torch.no_grad()
def _generic_step(optimizer, grads, grad_scale, found_inf, clip_coef, out16):
    multiplier = host_multiplier(grad_scale, found_inf, clip_coef)
    if multiplier is None:
        return
    given = []   # params whose .grad this call set (cleared again after the step)
    for gi, group in enumerate(optimizer.param_groups):
        listed = grads[gi] if grads is not None else None
        for j, p in enumerate(group["params"]):
            g = listed[j] if listed is not None else p.grad
            if g is None:
                continue
            if g.dtype != p.dtype or g.device != p.device:
                g = g.to(device=p.device, dtype=p.dtype) * multiplier if multiplier != 1.0 else \
                    g.to(device=p.device, dtype=p.dtype)
            elif multiplier != 1.0:
                # the engine's own gradient buffers (p.grad) are scaled in place: they are zeroed after the step
                g = g.mul_(multiplier) if listed is None else g * multiplier
            if listed is not None or g is not p.grad:
                p.grad = g
                given.append(p)
    optimizer.step()
    for p in given:
        p.grad = None
    if out16 is not None:
        for group, outs in zip(optimizer.param_groups, out16):
            for p, o in zip(group["params"], outs):
                if o is not None and o is not p:
                    o.copy_(p.detach().view(o.shape), non_blocking=True)
