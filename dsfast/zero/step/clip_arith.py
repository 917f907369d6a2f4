"""DeepSpeed 0.19.8's own arithmetic for the global gradient norm and the clip coefficient, stage by stage.

A run that clips is bit-identical to DeepSpeed's only if the coefficient is, to the last bit: Adam's first steps turn
a one-ulp difference into a sign. DeepSpeed computes it differently at each stage:

  stage 0 (runtime/utils.py clip_grad_norm_)  per-parameter fp32 norms; their squares summed in fp32; sqrt (pow 1/2);
                                              coef = min(1, max_norm / (norm + 1e-6)), all fp32.
  stages 1-2 (stage_1_and_2.py)               per-piece float64 norms; squares summed in float64, rounded to fp32;
                                              summed over ranks in fp32; pow 1/2 per param group; the groups'
                                              vector norm; coef = 1 / clamp((norm + 1e-6) / max_norm, min=1), fp32.
  stage 3 (stage3.py)                         the same per group, in float64 throughout.

`pieces` are (group, tensor) in DeepSpeed's order: each parameter's gradient (stage 0) or the part this rank owns
(stages 1-3), carrying `factor` (1/world x 1/loss_scale) still to apply. DeepSpeed's tensors are averaged (and
loss-scaled) before the norm; with `factor` a power of two (any loss scale, 1 or 2 ranks ... any power-of-two world)
applying it to the finished norm gives the same bits, as scaling by 2^k is exact.
"""
import torch

CLIP_EPS = 1e-6   # DeepSpeed's: max_norm / (total_norm + 1e-6)


# On a CPU, DeepSpeed's float64 norms (stages 1-3) cost 4-8x the fp32 pass: the conversion is the work. Up to these
# sizes they are taken exactly (through one reused float64 scratch buffer: no allocation per step); above, each
# piece's norm is accumulated in fp32 as before, and the coefficient can differ from DeepSpeed's in its last bits.
EXACT_CPU_TOTAL = 1 << 24     # gradient elements per rank
EXACT_CPU_PIECE = 1 << 22     # elements of the largest piece (the scratch buffer: 32 MB)
_scratch = None


def _cpu_float64_norm(t):
    """||t|| in float64, bit-identical to torch.linalg.vector_norm(t.double()) (DeepSpeed's), without allocating."""
    global _scratch
    if _scratch is None or _scratch.numel() < t.numel():
        _scratch = torch.empty(max(t.numel(), 1 << 16), dtype=torch.float64)
    buf = _scratch[:t.numel()].view(t.shape)
    buf.copy_(t)
    return torch.linalg.vector_norm(buf, 2.0)


def exact_cpu(sizes):
    """Whether a rank's pieces of these sizes get DeepSpeed's exact float64 norms on a CPU (EXACT_CPU_*): decided
    over all of them, also where they are measured a few at a time (landed_norms.py)."""
    return not sizes or (sum(sizes) <= EXACT_CPU_TOTAL and max(sizes) <= EXACT_CPU_PIECE)


def piece_norms(pieces, stage, exact=None):
    """Each piece's 2-norm in DeepSpeed's dtype for `stage` (fp32 at stage 0, float64 above; fp32 on a CPU above
    EXACT_CPU_*: `exact`, None = decided from these pieces). dtype= reads the tensor as DeepSpeed's
    .float()/.double() copy would, without the copy (the same bits on a CPU; on a GPU not compared)."""
    tensors = [t for _, t in pieces]
    if stage == 0:
        return [torch.linalg.vector_norm(t, 2.0, dtype=torch.float32) for t in tensors]
    if tensors and tensors[0].device.type == "cpu":
        if not (exact if exact is not None else exact_cpu([t.numel() for t in tensors])):
            return list(torch._foreach_norm(tensors, 2, dtype=torch.float32))
        return [_cpu_float64_norm(t) for t in tensors]
    return [torch.linalg.vector_norm(t, 2.0, dtype=torch.float64) for t in tensors]


def group_partials(pieces, norms, stage, groups, device):
    """This rank's per-group sums of squared norms as float64 values (the all-reduce sums them over ranks): fp32
    sums at stages 0-2 (held exactly in float64), float64 at stage 3. Group order: 0 .. groups-1."""
    out = []
    for g in range(groups):
        mine = [n for (gi, _), n in zip(pieces, norms) if gi == g]
        if not mine:
            out.append(torch.zeros((), dtype=torch.float64, device=device))
            continue
        s = torch.stack(mine).pow(2.0).sum()   # (fp32 norms on a large CPU run: see EXACT_CPU_TOTAL)
        out.append((s.float() if stage < 3 else s).to(device=device, dtype=torch.float64))
    return torch.stack(out) if out else torch.zeros(0, dtype=torch.float64, device=device)


def stage0_coef(total, max_norm):
    """DeepSpeed's stage-0 clip coefficient (runtime/utils.py clip_grad_norm_): min(1, max_norm / (norm + 1e-6)),
    in the norm's dtype."""
    return torch.min(torch.ones((), dtype=total.dtype, device=total.device),
                     torch.full((), float(max_norm), dtype=total.dtype, device=total.device) / (total + CLIP_EPS))


def norm_and_coef(partials, stage, factor, max_norm):
    """(global norm after `factor`, clip coefficient as float32) from the rank-summed group partials, each as
    DeepSpeed computes it. Non-finite when the fp32 sums overflowed: the caller falls back to float64."""
    dtype = torch.float32 if stage < 3 else torch.float64
    sums = partials.to(dtype)   # stages 1-2: the fp32 sum over ranks (exact for two; see the module docstring)
    if stage == 0:
        total = sums[0].pow(1.0 / 2) * factor
        return total, stage0_coef(total, max_norm)
    group_norms = sums.pow(1.0 / 2)
    total = torch.linalg.vector_norm(group_norms, 2.0) * factor
    coef = 1.0 / torch.clamp((total + CLIP_EPS) / max_norm, min=1.0)
    return total, coef.to(torch.float32)
