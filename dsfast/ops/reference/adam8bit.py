"""Adam/AdamW with 8-bit block-wise moments in pure torch: the quantization maps, (de)quantization, and
adam8bit_step computing the same bits as the native op's scalar body (csrc/cpu/kernel_8bit.h): every fp32
operation in optim_math.h's order, the coefficients rounded to fp32 as make_adam_coeffs rounds them.

Layout (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization"; bitsandbytes and torchao use it):
each moment is a uint8 code per element, an index into a sorted 256-entry map of values in [-1, 1], times one
fp32 scale per block of QUANT_BLOCK elements, the block's absmax. exp_avg uses the signed dynamic map, exp_avg_sq
the unsigned one (twice the resolution on [0, 1], so small second moments, which set the step size, survive)."""
import math

import torch

QUANT_BLOCK = 256   # csrc/cpu/cpu_optim.h's kQuantBlock, bitsandbytes' and torchao's block size
_MAPS = {}


def dynamic_map(signed):
    """The dynamic (tree) map of the paper above: levels 10^-6 .. 10^0; within level i, the midpoints of an even
    split of [0.1, 1] into 2^i parts (signed: each also negated) or 2^(i+1) parts (unsigned); plus 0 and 1.
    256 ascending float32 values either way."""
    key = bool(signed)
    if key not in _MAPS:
        values = [0.0, 1.0]
        for level in range(7):
            parts = 2 ** level if signed else 2 ** (level + 1)
            edges = [0.1 + 0.9 * k / parts for k in range(parts + 1)]
            for a, b in zip(edges, edges[1:]):
                mid = 10.0 ** (level - 6) * (a + b) / 2
                values += [mid, -mid] if signed else [mid]
        _MAPS[key] = torch.tensor(sorted(values), dtype=torch.float32)
    return _MAPS[key]


def exp_avg_map():
    return dynamic_map(signed=True)


def exp_avg_sq_map():
    return dynamic_map(signed=False)


def num_blocks(numel):
    return (numel + QUANT_BLOCK - 1) // QUANT_BLOCK


def _blocks(x):
    """x (1-D fp32) as [blocks, QUANT_BLOCK] rows, the last padded with zeros."""
    pad = num_blocks(x.numel()) * QUANT_BLOCK - x.numel()
    return torch.nn.functional.pad(x, (0, pad)).view(-1, QUANT_BLOCK)


def nearest_codes(qmap, x):
    """The kernel's nearest_code: the largest i with map[i] <= x, then i + 1 where strictly nearer."""
    i = (torch.searchsorted(qmap, x, right=True) - 1).clamp_(0, 255)
    lo, hi = qmap[i], qmap[(i + 1).clamp_(max=255)]
    return (i + ((i < 255) & ((hi - x) < (x - lo))).long()).to(torch.uint8)


def quantize(x, qmap):
    """(codes uint8 [n], scales fp32 [blocks]) of a float tensor: per block absmax, then nearest codes."""
    flat = x.detach().reshape(-1).float()
    rows = _blocks(flat)
    scales = rows.abs().amax(dim=1)
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    codes = nearest_codes(qmap, (rows / safe[:, None]).reshape(-1)[:flat.numel()])
    return codes, scales


def dequantize(codes, scales, qmap):
    """fp32 values [n] of (codes, scales): map[code] * the block's scale."""
    n = codes.numel()
    per_elem = scales.repeat_interleave(QUANT_BLOCK)[:n]
    return qmap[codes.reshape(-1).long()] * per_elem


def _sqrt(x):
    """Correctly rounded fp32 sqrt, as the kernels' sqrtss / vsqrtps: torch's vectorized CPU sqrt may be an ulp
    off (Sleef), while the square root in float64 rounded once to fp32 is exact."""
    return torch.sqrt(x.double()).float()


def _f32(x):
    return torch.tensor(x, dtype=torch.float32)


def check_adam8bit_args(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs,
                        steps, exp_avg_map_, exp_avg_sq_map_, label="params"):
    """The native op's argument checks (csrc/bindings/cpu_optim.cpp), from metadata only: the reference's and the
    fake implementation's. ValueError / TypeError naming "<label>[i]" and what would be valid."""
    n = len(params)
    for name, seq in (("grads", grads), ("exp_avg_codes", exp_avg_codes), ("exp_avg_scales", exp_avg_scales),
                      ("exp_avg_sq_codes", exp_avg_sq_codes), ("exp_avg_sq_scales", exp_avg_sq_scales),
                      ("steps", steps)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries but there are {n} params")
    if len(outs) not in (0, n):
        raise ValueError(f"outs has {len(outs)} entries; pass [] or one per param ({n})")
    for what, m in (("exp_avg_map", exp_avg_map_), ("exp_avg_sq_map", exp_avg_sq_map_)):
        if m.dtype != torch.float32 or m.numel() != 256 or m.device.type != "cpu":
            raise ValueError(f"{what} must be a contiguous float32 cpu tensor of 256 ascending values")
    for i, p in enumerate(params):
        w = f"{label}[{i}]"
        if p.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"{w} is {p.dtype}; 8-bit states step float32 or bfloat16 params")
        if outs and outs[i] is not None and p.dtype != torch.float32:
            raise ValueError(f"{w} has a 16-bit output but is itself {p.dtype}: a 16-bit master is its own 16-bit "
                             "copy; pass no output for it")
        for what, t, dtype, count in (
                ("exp_avg_codes", exp_avg_codes[i], torch.uint8, p.numel()),
                ("exp_avg_scales", exp_avg_scales[i], torch.float32, num_blocks(p.numel())),
                ("exp_avg_sq_codes", exp_avg_sq_codes[i], torch.uint8, p.numel()),
                ("exp_avg_sq_scales", exp_avg_sq_scales[i], torch.float32, num_blocks(p.numel()))):
            if t.dtype != dtype or t.numel() != count or t.device.type != "cpu":
                raise ValueError(f"{w} state['{what}'] must be a contiguous {str(dtype).replace('torch.', '')} cpu "
                                 f"tensor of {count} elements")
        if grads[i].shape != p.shape:
            raise ValueError(f"{w}.grad has shape {tuple(grads[i].shape)} but the parameter has shape {tuple(p.shape)}")


def adam8bit_step(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs, steps,
                  exp_avg_map_, exp_avg_sq_map_, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction,
                  grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    from .cpu_optim import check_isa, row_seed, stochastic_bf16
    check_isa(isa)
    check_adam8bit_args(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs,
                        steps, exp_avg_map_, exp_avg_sq_map_, label)
    if any((m[1:] <= m[:-1]).any() for m in (exp_avg_map_, exp_avg_sq_map_)):
        raise ValueError("a quantization map must be 256 ascending values")
    with torch.no_grad():
        for i, stored in enumerate(params):
            step = int(steps[i].item()) + 1
            bc1 = 1.0 - beta1 ** step if bias_correction else 1.0
            bc2 = 1.0 - beta2 ** step if bias_correction else 1.0
            p = stored.reshape(-1).float()
            g = grads[i].reshape(-1).float() * _f32(grad_scale)
            m = dequantize(exp_avg_codes[i], exp_avg_scales[i], exp_avg_map_)
            v = dequantize(exp_avg_sq_codes[i], exp_avg_sq_scales[i], exp_avg_sq_map_)
            if not adamw and weight_decay != 0:
                g = g + _f32(weight_decay) * p
            m = m + _f32(1.0 - beta1) * (g - m)
            v = _f32(beta2) * v + _f32(1.0 - beta2) * g * g
            denom = _sqrt(v) * _f32(1.0 / math.sqrt(bc2)) + _f32(eps)
            decay = _f32(lr * weight_decay) if adamw else _f32(0.0)
            p = p * (_f32(1.0) - decay)
            p = p - _f32(lr / bc1) * m / denom
            if round_seed and stored.dtype == torch.bfloat16:
                stored.view(-1).copy_(stochastic_bf16(p, row_seed(round_seed, i)))
            else:
                stored.view(-1).copy_(p)
            for codes, scales, x, qmap in ((exp_avg_codes[i], exp_avg_scales[i], m, exp_avg_map_),
                                           (exp_avg_sq_codes[i], exp_avg_sq_scales[i], v, exp_avg_sq_map_)):
                c, s = quantize(x, qmap)
                codes.view(-1).copy_(c)
                scales.copy_(s)
            if outs and outs[i] is not None:
                outs[i].view(-1).copy_(p)
            steps[i].add_(1)
