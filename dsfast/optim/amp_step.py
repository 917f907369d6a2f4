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
"""
import torch


def takes_amp_step(optimizer):
    return bool(getattr(optimizer, "_dsfast_amp_step", False))


def amp_step(optimizer, *, grads=None, grad_scale=None, found_inf=None, clip_coef=None, out16=None):
    if takes_amp_step(optimizer):
        optimizer.step(grads=grads, grad_scale=grad_scale, found_inf=found_inf, clip_coef=clip_coef, out16=out16)
        return
    _generic_step(optimizer, grads, grad_scale, found_inf, clip_coef, out16)


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
