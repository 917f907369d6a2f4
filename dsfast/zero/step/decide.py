"""The first half of every stage's optimizer step: overflow, global norm and clip coefficient, decided once.

    decision = decide(grads, factor, clip, check_overflow, world, group)
    amp_step(optimizer, **decision.step_kwargs(), grads=..., out16=...)      # the second half (optim/amp_step.py)
    applied = decision.applied()                                             # read after the update is queued

`grads` are this rank's reduced gradient tensors (stage 0: the whole all-reduced buckets; stages 1-3: this rank's
shards), carrying `factor` (1/world x 1/loss_scale) still to be applied. One read pass gives each tensor's sum of
squares; one all-reduce of a single float64 sums them over ranks, so every rank takes the same decision.

Overflow is element-wise: the float64 sum of squares of finite fp32/bf16/fp16 values cannot overflow (their
squares stay below 2^256), so it is non-finite exactly when some element is inf or NaN. A finite gradient of 1e22
(bf16 holds it) is therefore not an overflow, and its norm (1e22) clips instead of skipping.
Nothing is read back to the host here on a GPU (accumulation in float64 there: the pass is bandwidth-bound
either way); on CPU tensors the fast fp32 pass is redone in float64 only for tensors whose fp32 sum overflowed.

Given `pieces` (the gradients per parameter, in DeepSpeed's order and param groups), the norm and clip coefficient
are DeepSpeed's own arithmetic for the stage (clip_arith.py), so that a clipped run is bit-identical to DeepSpeed's;
where that arithmetic is not finite (fp32 sums past 3.4e38) the float64 one above decides, as without pieces.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ...comm.where import wait_now
from .clip_arith import CLIP_EPS, group_partials, norm_and_coef, piece_norms


@dataclass
class StepDecision:
    grad_scale: Optional[torch.Tensor]   # the scale the gradients carry (1 / factor), float64; None when 1
    found_inf: Optional[torch.Tensor]    # float32, nonzero: skip (None: no overflow check)
    clip_coef: Optional[torch.Tensor]    # float32 multiplier (None: no clipping)
    norm: Optional[torch.Tensor]         # global norm after `factor`, float64 (None: neither clip nor check)

    def step_kwargs(self):
        return {"grad_scale": self.grad_scale, "found_inf": self.found_inf, "clip_coef": self.clip_coef}

    def applied(self):
        """Whether the step was taken (reads the flag: call it after the update is queued)."""
        return self.found_inf is None or not bool(self.found_inf)


def exact_on_device(device):
    """Accumulate in float64 in one pass (no host read). On the CPU the fp32 pass plus a rare redo is faster."""
    return device.type != "cpu"


def sum_of_squares(grads, device, norms=None):
    """float64 0-dim tensor: the sum of every element's square (non-finite iff some element is). norms: the
    tensors' norms already taken (fp32 or float64), reused."""
    keep = [i for i, g in enumerate(grads) if g.numel()]
    grads = [grads[i] for i in keep]
    if not grads:
        return torch.zeros((), dtype=torch.float64, device=device)
    if norms is not None and (norms[0].dtype == torch.float64 or not exact_on_device(device)):
        norms = [norms[i] for i in keep]   # (fp32 norms on a GPU: their inf check would read back each one)
    elif exact_on_device(device):
        norms = torch._foreach_norm(grads, 2, dtype=torch.float64)
    else:
        norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
    norms = list(norms)
    for i, n in enumerate(norms):
        if n.dtype != torch.float64 and torch.isinf(n):   # squares past fp32's range, or a real inf
            norms[i] = torch.linalg.vector_norm(grads[i], dtype=torch.float64)
    return torch.stack([n.to(torch.float64) for n in norms]).square().sum()


@torch.no_grad()
def decide(grads, factor, clip, check_overflow, world=1, group=None, device=None, pieces=None, stage=0, groups=1,
           norms=None):
    """The step decision over this rank's gradient tensors (see the module docstring). clip: max global norm
    (0 = off); world > 1 sums the squares over `group` with one all-reduce (every rank calls it).
    pieces: [(param group, gradient tensor)] in DeepSpeed's order, `groups` groups, for DeepSpeed's arithmetic of
    `stage` (clip_arith.py); then `grads` is not read. norms: the pieces' norms taken already, as piece_norms
    takes them (landed_norms.py: as each unit's reduction landed)."""
    device = device or (grads[0].device if grads else torch.device("cpu"))
    grad_scale = None if factor == 1.0 else torch.full((), 1.0 / factor, dtype=torch.float64, device=device)
    if not (clip > 0 or check_overflow):
        return StepDecision(grad_scale, None, None, None)
    if pieces is None:
        sums = sum_of_squares(grads, device).view(1)
    else:   # one all-reduce for both: [float64 sum of squares, DeepSpeed's per-group partial sums ...]
        norms = norms if norms is not None else piece_norms(pieces, stage)
        sums = torch.cat([sum_of_squares([t for _, t in pieces], device, norms).view(1),
                          group_partials(pieces, norms, stage, groups, device)])
    if world > 1:
        wait_now(dist.all_reduce(sums, group=group, async_op=True), ("decision",))
    sq = sums[0]
    norm = sq.sqrt() * factor
    found_inf = (~torch.isfinite(sq)).to(torch.float32) if check_overflow else None
    clip_coef = None
    if clip > 0:
        clip_coef = (clip / (norm + CLIP_EPS)).clamp(max=1.0).to(torch.float32)
        if pieces is not None:   # DeepSpeed's bits wherever its arithmetic is finite (no host read)
            ds_norm, ds_coef = norm_and_coef(sums[1:], stage, factor, clip)
            exact = torch.isfinite(ds_norm) & torch.isfinite(ds_coef)
            clip_coef = torch.where(exact, ds_coef, clip_coef)
            norm = torch.where(exact, ds_norm.to(torch.float64), norm)
    return StepDecision(grad_scale, found_inf, clip_coef, norm)
