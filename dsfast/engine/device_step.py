"""The optimizer step without host syncs, for optimizers whose kernel unscales, clips and skips by itself.

dsfast's FusedAdam / FusedSGD take step(grad_scale=, found_inf=, clip_coef=) as device tensors. Here the engine
computes those on the device (one read pass over the gradient buckets when clipping or an overflow check is on)
and queues the optimizer kernel behind them: nothing is read back to the host before the update is queued.

The one read that remains is the overflow flag, and only when the precision checks for overflow (fp16, or bf16
with check_grad_overflow): DeepSpeed's semantics need it on the host (a skipped step does not advance the LR
scheduler, counts in skipped_steps, and drives the loss-scale update that the next backward multiplies by). The
engine reads it after this function returns, i.e. after the optimizer kernel and the master -> model copy are
queued, so the device is never idle waiting for the host to decide. fp32 and bf16 without the check read nothing.
"""
import torch


def takes_device_scalars(optimizer):
    """True for the optimizers whose step() unscales, clips and skips on the device (dsfast FusedAdam/FusedSGD)."""
    from ..optim.fused_adam import FusedAdam   # lazily: importing the engine loads no optimizer module
    from ..optim.fused_sgd import FusedSGD
    return isinstance(optimizer, (FusedAdam, FusedSGD))


@torch.no_grad()
def queue_device_step(precision, optimizer, flats, factor, clip, check_overflow):
    """Queue overflow check, clip coefficient and optimizer.step(grad_scale=, found_inf=, clip_coef=).

    factor: what the reduced grads must be multiplied by (1/world x 1/loss_scale); clip: max global norm (0 =
    off). Returns (found_inf, norm): device tensors, or None for what was not computed. found_inf is nonzero when
    the step was skipped (its kernel left params and states untouched); norm is the global gradient norm after
    `factor`. Same results as mixed_precision.finalize_grads + optimizer.step, with the arithmetic in the kernel.
    """
    from ..ops import multi_tensor
    if not flats:
        precision.optimizer_step(optimizer)
        return None, None
    device = flats[0].device
    found_inf = torch.zeros((), dtype=torch.float32, device=device) if check_overflow else None
    kwargs = {}
    norm = None
    if clip > 0:
        inv = torch.full((), factor, dtype=torch.float32, device=device)
        norm, coef = multi_tensor.grad_norm_and_clip_coef(flats, clip, inv_scale=inv, found_inf=found_inf)
        kwargs["clip_coef"] = coef
        # The kernel takes the scale and inverts it in float64, then rounds once: pass 1/factor in float64 so
        # the inverse it uses is float32(factor), the same number the unscale pass above multiplied by.
        if factor != 1.0:
            kwargs["grad_scale"] = torch.full((), 1.0 / factor, dtype=torch.float64, device=device)
    elif check_overflow:
        # No norm is wanted: the same fused unscale + inf/NaN flag pass as the synchronous path (a norm would
        # also flag finite gradients whose squares overflow fp32, which bf16 can hold).
        multi_tensor.unscale_and_check_(flats, torch.full((), factor, dtype=torch.float32, device=device),
                                        found_inf)
    elif factor != 1.0:
        kwargs["grad_scale"] = torch.full((), 1.0 / factor, dtype=torch.float64, device=device)
    if found_inf is not None:
        kwargs["found_inf"] = found_inf
    precision.optimizer_step(optimizer, **kwargs)
    return found_inf, norm
