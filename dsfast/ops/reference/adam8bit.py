"""Adam/AdamW with 8-bit block-wise moments in pure torch: the code formats, (de)quantization, and adam8bit_step
computing the same bits as the native op's scalar body (csrc/cpu/kernel_8bit.h): every fp32 operation in
optim_math.h's order, the coefficients rounded to fp32 as make_adam_coeffs rounds them.

Layout (block-wise, as Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", bitsandbytes and
torchao): each moment is a uint8 code per element times one fp32 scale per block of QUANT_BLOCK elements, the
block's absmax / CODE_TOP. The codes are minifloats with 3 mantissa bits, so the nearest code is computed from the
fp32 bit pattern (a SIMD-friendly integer round, no table search): a magnitude code k >= 1 stands for
2^((k >> 3) - e0) * (1 + (k & 7) / 8), k = 0 for 0. exp_avg: sign in bit 7 and a 7-bit magnitude, e0 = 15
(E4M3-like, 2^-15 * 1.125 .. 1.875: relative error <= 1/16 over 15 binades below the absmax). exp_avg_sq: an
unsigned 8-bit magnitude, e0 = 31 (E5M3-like, 31 binades: small second moments, which set the step size, survive),
and a positive value never rounds to 0 (code 1 at least), so m / (sqrt(v) + eps) cannot blow up."""
import math

import torch

QUANT_BLOCK = 256   # csrc/cpu/cpu_optim.h's kQuantBlock, bitsandbytes' and torchao's block size
CODE_TOP = 1.875    # kCodeTop: the value of the largest magnitude code
_BIAS = {True: (127 - 15) << 3, False: (127 - 31) << 3}   # kMomentBias, kSquareBias: code k's fp32 bits (k + bias) << 20
_MOMENT_HALF_SMALLEST = 1.125 / 65536   # kMomentHalfSmallest: half of exp_avg's code 1
_TABLES = {}


def code_values(signed):
    """The fp32 value of each of the 256 codes (signed: exp_avg's format; unsigned: exp_avg_sq's), scale 1."""
    key = bool(signed)
    if key not in _TABLES:
        c = torch.arange(256, dtype=torch.int32)
        mag = c & 127 if signed else c
        values = torch.where(mag == 0, 0, (mag + _BIAS[key]) << 20).view(torch.float32)
        if signed:
            values = torch.where((c & 128) != 0, -values, values)
        _TABLES[key] = values
    return _TABLES[key]


def num_blocks(numel):
    return (numel + QUANT_BLOCK - 1) // QUANT_BLOCK


def _blocks(x):
    """x (1-D fp32) as [blocks, QUANT_BLOCK] rows, the last padded with zeros."""
    pad = num_blocks(x.numel()) * QUANT_BLOCK - x.numel()
    return torch.nn.functional.pad(x, (0, pad)).view(-1, QUANT_BLOCK)


def encode(x, inv, signed):
    """The kernel's codes of fp32 x times inv (kCodeTop / the block's absmax, broadcast): round |x| * inv to 3
    mantissa bits on its fp32 bits (ties away from zero), re-bias the exponent, clamp to the top code; below code 1:
    nearest of 0 and code 1 (signed), any positive value to code 1 (unsigned)."""
    y = x.abs() * inv
    top = torch.tensor(CODE_TOP)
    y = torch.where(y < top, y, top)            # NaN too, as the kernel's (y < top ? y : top)
    u = y.view(torch.int32)
    k = ((u + 0x80000) >> 20) - _BIAS[bool(signed)]
    low = (y >= _MOMENT_HALF_SMALLEST) if signed else (y > 0)
    k = torch.where(k < 1, low.to(torch.int32), k)
    if signed:
        k = k | torch.where((k != 0) & (x.view(torch.int32) < 0), 128, 0)
    return k.to(torch.uint8)


_CHUNK_BLOCKS = 1 << 14   # quantize() works 4M elements at a time: its temporaries stay ~100 MB whatever the size


def quantize(x, signed):
    """(codes uint8 [n], scales fp32 [blocks]) of a float tensor: per block absmax, then the computed codes."""
    flat = x.detach().reshape(-1)
    n, blocks = flat.numel(), num_blocks(flat.numel())
    codes = torch.empty(blocks * QUANT_BLOCK, dtype=torch.uint8)
    scales = torch.empty(blocks)
    top = torch.tensor(CODE_TOP)
    for b0 in range(0, blocks, _CHUNK_BLOCKS):
        b1 = min(b0 + _CHUNK_BLOCKS, blocks)
        rows = _blocks(flat[b0 * QUANT_BLOCK:min(b1 * QUANT_BLOCK, n)].float())
        absmax = rows.abs().amax(dim=1)
        # at most FLT_MAX, as the kernel's: a block of tiny moments would get an infinite inverse (0 * inf = NaN)
        inv = torch.where(absmax > 0, (top / absmax).clamp(max=torch.finfo(torch.float32).max),
                          torch.zeros_like(absmax))
        codes[b0 * QUANT_BLOCK:b1 * QUANT_BLOCK] = encode(rows, inv[:, None], signed).reshape(-1)
        scales[b0:b1] = absmax / top
    return codes[:n], scales


def dequantize(codes, scales, signed, first=0):
    """fp32 values [n] of (codes, scales): the code's value times its block's scale. `first`: where codes[0] sits in
    scales[0]'s block (a run cut from a saved record at any element); 4M elements at a time, so the temporaries
    stay small whatever the size."""
    codes, table = codes.reshape(-1), code_values(signed)
    out = torch.empty(codes.numel())
    step = _CHUNK_BLOCKS * QUANT_BLOCK
    for a in range(0, codes.numel(), step):
        b = min(a + step, codes.numel())
        k0, k1 = (first + a) // QUANT_BLOCK, (first + b - 1) // QUANT_BLOCK
        lo = first + a - k0 * QUANT_BLOCK
        per_elem = scales[k0:k1 + 1].repeat_interleave(QUANT_BLOCK)[lo:lo + b - a]
        torch.mul(table.index_select(0, codes[a:b].int()), per_elem, out=out[a:b])
    return out


def _sqrt(x):
    """Correctly rounded fp32 sqrt, as the kernels' sqrtss / vsqrtps: torch's vectorized CPU sqrt may be an ulp
    off (Sleef), while the square root in float64 rounded once to fp32 is exact."""
    return torch.sqrt(x.double()).float()


def _f32(x):
    return torch.tensor(x, dtype=torch.float32)


def check_adam8bit_args(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs,
                        steps, label="params"):
    """The native op's argument checks (csrc/bindings/cpu_optim_adam8bit.cpp), from metadata only: the reference's
    and the fake implementation's. ValueError / TypeError naming "<label>[i]" and what would be valid."""
    n = len(params)
    for name, seq in (("grads", grads), ("exp_avg_codes", exp_avg_codes), ("exp_avg_scales", exp_avg_scales),
                      ("exp_avg_sq_codes", exp_avg_sq_codes), ("exp_avg_sq_scales", exp_avg_sq_scales),
                      ("steps", steps)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries but there are {n} params")
    if len(outs) not in (0, n):
        raise ValueError(f"outs has {len(outs)} entries; pass [] or one per param ({n})")
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
                  lr, beta1, beta2, eps, weight_decay, adamw, bias_correction,
                  grad_scale=1.0, num_threads=0, isa="auto", label="params", round_seed=0):
    from .cpu_optim import check_isa, row_seed, stochastic_bf16
    check_isa(isa)
    check_adam8bit_args(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs,
                        steps, label)
    with torch.no_grad():
        for i, stored in enumerate(params):
            step = int(steps[i].item()) + 1
            bc1 = 1.0 - beta1 ** step if bias_correction else 1.0
            bc2 = 1.0 - beta2 ** step if bias_correction else 1.0
            p = stored.reshape(-1).float()
            g = grads[i].reshape(-1).float() * _f32(grad_scale)
            m = dequantize(exp_avg_codes[i], exp_avg_scales[i], True)
            v = dequantize(exp_avg_sq_codes[i], exp_avg_sq_scales[i], False)
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
            for codes, scales, x, signed in ((exp_avg_codes[i], exp_avg_scales[i], m, True),
                                             (exp_avg_sq_codes[i], exp_avg_sq_scales[i], v, False)):
                c, s = quantize(x, signed)
                codes.view(-1).copy_(c)
                scales.copy_(s)
            if outs and outs[i] is not None:
                outs[i].view(-1).copy_(p)
            steps[i].add_(1)
