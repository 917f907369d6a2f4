// Adam with 8-bit block-wise moments (cpu_optim.h's Adam8bitTensor), included by each isa_*.cpp after
// kernel_body.h, inside the same DSFAST_ISA_NS. Per block of kQuantBlock elements, in one pass that stays in L1:
//   1. decode: m[k] = value(code) * scale, the value computed from the code's bits (no table);
//   2. the fp32 Adam update of kernel_body.h's adam_span, vectorized with this ISA's Vec, reading and writing
//      those buffers as fp32 states (so the update is bit for bit the fp32-state kernel's);
//   3. encode with the block's fresh absmax: the nearest minifloat code of |x| * (kCodeTop / absmax), computed by
//      rounding the fp32 bit pattern to 3 mantissa bits (integer adds and shifts, no search, no division).
// Steps 1 and 3 are branch-free integer / fp32 loops that the compiler vectorizes for this TU's target; every
// operation in them is exact or a single correctly rounded fp32 op, so all ISAs give the same codes and scales.
// The formats are cpu_optim.h's (kMomentBias / kSquareBias); dsfast/ops/reference/adam8bit.py computes the same bits.
#pragma once

#include <cstring>

namespace dsfast {
namespace cpu {
namespace DSFAST_ISA_NS {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// max |m| and max |v| over the block, on the bits: for non-negative floats the int32 order is the float order (a
// NaN, whose bits are above infinity's, wins, as torch's amax propagates it); an integer max reduction vectorizes.
inline void block_absmax(const float* m, const float* v, int64_t n, float* m_abs, float* v_abs) {
  int32_t a = 0, b = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int32_t um = int32_t(float_bits(m[k]) & 0x7FFFFFFFu), uv = int32_t(float_bits(v[k]) & 0x7FFFFFFFu);
    a = um > a ? um : a;
    b = uv > b ? uv : b;
  }
  *m_abs = bits_float(uint32_t(a));
  *v_abs = bits_float(uint32_t(b));
}

// Value of a magnitude code k (1..kmax) of a format with this exponent bias: 2^((k >> 3) - e0) * (1 + (k & 7) / 8),
// i.e. the fp32 whose exponent and top 3 mantissa bits are k + bias; k = 0 is 0.
inline uint32_t magnitude_bits(uint32_t k, uint32_t bias) { return k ? (k + bias) << 20 : 0u; }

// Nearest magnitude code of y >= 0 given by its bits u, clamped to kCodeTop (a NaN too): round the fp32 to 3
// mantissa bits (ties to even; a carry moves to the next binade) and re-bias the exponent. Below code 1 the
// result is <= 0: the callers choose 0 or 1 there. All int32 arithmetic, so the loops vectorize.
inline int32_t rounded_code(int32_t u, int32_t bias) {
  const int32_t top = int32_t(float_bits(kCodeTop));
  u = u < top ? u : top;
  return ((u + 0x7FFFF + ((u >> 20) & 1)) >> 20) - bias;
}

#ifdef DSFAST_8BIT_AVX512
#include "kernel_8bit_avx512.h"
#endif

inline void decode_moments(const uint8_t* mc, const uint8_t* vc, float ms, float vs, int64_t n, float* m, float* v) {
  int64_t k = 0;
#ifdef DSFAST_8BIT_WIDE
  k = decode_wide(mc, vc, ms, vs, n, m, v);   // kernel_8bit_avx512.h: whole 16s; the rest below
#endif
  for (; k < n; ++k) {
    const uint32_t c = mc[k];
    const uint32_t mag = c & 127u;
    m[k] = bits_float(mag ? magnitude_bits(mag, kMomentBias) | ((c & 128u) << 24) : 0u) * ms;
    v[k] = bits_float(magnitude_bits(vc[k], kSquareBias)) * vs;
  }
}

// Both moments' codes, in one loop. exp_avg: sign in bit 7, magnitude rounded to nearest (below half the smallest
// code: 0; zero is code 0). exp_avg_sq: unsigned, rounded to nearest, except that a positive value never becomes 0
// (code 1 at least): m / (sqrt(v) + eps) must not blow up where v is tiny but m is not.
inline void encode_moments(const float* m, const float* v, int64_t n, float m_abs, float v_abs, uint8_t* mc,
                           uint8_t* vc) {
  const float m_inv = m_abs > 0.0f ? kCodeTop / m_abs : 0.0f;
  const float v_inv = v_abs > 0.0f ? kCodeTop / v_abs : 0.0f;
  const int32_t half_smallest = int32_t(float_bits(kMomentHalfSmallest));
  int64_t k = 0;
#ifdef DSFAST_8BIT_WIDE
  k = encode_wide(m, v, n, m_inv, v_inv, mc, vc);
#endif
  for (; k < n; ++k) {
    const uint32_t ux = float_bits(m[k]);
    const int32_t u = int32_t(float_bits(bits_float(ux & 0x7FFFFFFFu) * m_inv));
    int32_t q = rounded_code(u, int32_t(kMomentBias));
    q = q < 1 ? int32_t(u >= half_smallest) : q;
    mc[k] = uint8_t(q | (q ? int32_t((ux >> 24) & 128u) : 0));
    const int32_t w = int32_t(float_bits(bits_float(float_bits(v[k]) & 0x7FFFFFFFu) * v_inv));
    const int32_t r = rounded_code(w, int32_t(kSquareBias));
    vc[k] = uint8_t(r < 1 ? int32_t(w > 0) : r);
  }
}

inline void adam8bit_range(const Adam8bitTensor& t, int64_t begin, int64_t end) {
  // the fp32-state span of this (param, grad, out) combination: validated by the dispatcher
  AdamSpanFn fn = kAdamTable[int(t.param_dtype)][kF32][int(t.grad_dtype)][int(t.out_dtype)];
  const int64_t pb = dtype_bytes(t.param_dtype), gb = dtype_bytes(t.grad_dtype);
  const AdamCoeffs c = t.coeffs;
  alignas(64) float m[kQuantBlock], v[kQuantBlock];
  for (int64_t b0 = begin; b0 < end; b0 += kQuantBlock) {   // begin is a block start (dispatch.cpp)
    const int64_t n = end - b0 < kQuantBlock ? end - b0 : kQuantBlock;
    const int64_t blk = b0 / kQuantBlock;
    uint8_t* mc = t.exp_avg_codes + b0;
    uint8_t* vc = t.exp_avg_sq_codes + b0;
    decode_moments(mc, vc, t.exp_avg_scales[blk], t.exp_avg_sq_scales[blk], n, m, v);
    void* out = t.out16 ? static_cast<uint16_t*>(t.out16) + b0 : nullptr;
    fn(static_cast<unsigned char*>(t.param) + b0 * pb, static_cast<const unsigned char*>(t.grad) + b0 * gb, m, v,
       out, n, c, t.round_seed, b0);
    float m_abs, v_abs;
    block_absmax(m, v, n, &m_abs, &v_abs);
    encode_moments(m, v, n, m_abs, v_abs, mc, vc);
    // the scale is the value of the top code (kCodeTop), so decoding multiplies once
    t.exp_avg_scales[blk] = m_abs / kCodeTop;
    t.exp_avg_sq_scales[blk] = v_abs / kCodeTop;
  }
}

}  // namespace DSFAST_ISA_NS
}  // namespace cpu
}  // namespace dsfast
