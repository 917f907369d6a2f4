// Adam with 8-bit block-wise moments (cpu_optim.h's Adam8bitTensor), included by each isa_*.cpp after
// kernel_body.h, inside the same DSFAST_ISA_NS. Per block of kQuantBlock elements, in two passes that stay in L1
// (adam8bit_fused, AVX2 / AVX-512):
//   1. per vector: decode m and v from their codes (value(code) * scale, the value from the code's bits, no table),
//      the fp32 Adam update of kernel_body.h's adam_vec (the same adam_update on the same Vec, so bit for bit the
//      fp32-state kernel's), the param store, the 16-bit output into an L1 buffer (streamed out after the loop),
//      the fresh moments into a small L1 buffer, |max| in registers;
//   2. encode from the buffer with the block's fresh absmax: the nearest minifloat code of |x| * (kCodeTop /
//      absmax), computed by rounding the fp32 bit pattern to 3 mantissa bits (ties away from zero: one integer add
//      and a shift, no search, no division).
// The scalar body, and a block whose length is not a multiple of the vector width, run the same steps as separate
// loops (decode_moments, adam_span, block_absmax, encode_moments). Decode and encode are exact integer work and
// single correctly rounded fp32 multiplies, so all ISAs give the same codes and scales for the same moments; the
// vector bodies' update contracts multiply-adds into FMAs, an ulp or two off the scalar body's params (the
// tolerance is stated in tests/test_cpu_optim_8bit.py).
// The formats are cpu_optim.h's (kMomentBias / kSquareBias); dsfast/ops/reference/adam8bit.py computes the same bits.
#pragma once

#include <algorithm>
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
// mantissa bits (ties away from zero, one add: a tie needs the 19 bits below the half to be zero, which a computed
// moment almost never has; a carry moves to the next binade) and re-bias the exponent. Below code 1 the result
// is <= 0: the callers choose 0 or 1 there. All int32 arithmetic, so the loops vectorize.
inline int32_t rounded_code(int32_t u, int32_t bias) {
  const int32_t top = int32_t(float_bits(kCodeTop));
  u = u < top ? u : top;
  return ((u + 0x80000) >> 20) - bias;
}

#ifdef DSFAST_8BIT_AVX512
#include "kernel_8bit_avx512.h"
#endif

// One vector of decoded moments straight from the codes (the same integer ops and the one fp32 multiply of
// decode_moments, so the same bits), and the running max of |x|'s bits (block_absmax's integer max), per ISA.
#if defined(DSFAST_8BIT_AVX512)
inline Vec decode_m_vec(const uint8_t* mc, const Vec& ms) { return Vec(decode_m16(mc, ms.v)); }
inline Vec decode_v_vec(const uint8_t* vc, const Vec& vs) { return Vec(decode_v16(vc, vs.v)); }
struct AbsMax {
  __m512i a;
  AbsMax() : a(_mm512_setzero_si512()) {}   // user-written: an implicit one would miss this TU's target
  void add(const Vec& x) { a = _mm512_max_epi32(a, _mm512_and_si512(_mm512_castps_si512(x.v), splat(0x7FFFFFFFu))); }
  int32_t get() const { return _mm512_reduce_max_epi32(a); }
};
#elif defined(DSFAST_8BIT_AVX2)
inline __m256i splat8(uint32_t x) { return _mm256_set1_epi32(int(x)); }
inline __m256i load8_codes(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// kernel_8bit_avx512.h's decode_m16 layout: the sign-extended code << 20, bits 27..29 set (the bias), 30 cleared
inline Vec decode_m_vec(const uint8_t* mc, const Vec& ms) {
  const __m256i x = _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mc))), 20);
  const __m256i bits = _mm256_or_si256(_mm256_andnot_si256(splat8(0x40000000u), x), splat8(0x38000000u));
  const __m256i zero = _mm256_cmpeq_epi32(_mm256_and_si256(x, splat8(0x07F00000u)), _mm256_setzero_si256());
  return Vec(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_andnot_si256(zero, bits)), ms.v));
}
inline Vec decode_v_vec(const uint8_t* vc, const Vec& vs) {
  const __m256i d = load8_codes(vc);
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(d, splat8(kSquareBias)), 20);
  const __m256i vb = _mm256_andnot_si256(_mm256_cmpeq_epi32(d, _mm256_setzero_si256()), bits);
  return Vec(_mm256_mul_ps(_mm256_castsi256_ps(vb), vs.v));
}
struct AbsMax {
  __m256i a;
  AbsMax() : a(_mm256_setzero_si256()) {}   // user-written: an implicit one would miss this TU's target
  void add(const Vec& x) {
    a = _mm256_max_epi32(a, _mm256_and_si256(_mm256_castps_si256(x.v), splat8(0x7FFFFFFFu)));
  }
  int32_t get() const {
    __m128i r = _mm_max_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    r = _mm_max_epi32(r, _mm_shuffle_epi32(r, 0x4E));
    r = _mm_max_epi32(r, _mm_shuffle_epi32(r, 0xB1));
    return _mm_cvtsi128_si32(r);
  }
};
#else
inline Vec decode_m_vec(const uint8_t* mc, const Vec& ms) {
  const uint32_t c = *mc, mag = c & 127u;
  return Vec(bits_float(mag ? magnitude_bits(mag, kMomentBias) | ((c & 128u) << 24) : 0u)) * ms;
}
inline Vec decode_v_vec(const uint8_t* vc, const Vec& vs) { return Vec(bits_float(magnitude_bits(*vc, kSquareBias))) * vs; }
struct AbsMax {
  int32_t a = 0;
  void add(const Vec& x) {
    const int32_t u = int32_t(float_bits(x.v) & 0x7FFFFFFFu);
    a = u > a ? u : a;
  }
  int32_t get() const { return a; }
};
#endif


// Copies a block's 16-bit outputs from the L1 buffer to out with non-temporal stores where out is aligned to the
// vector: the output is written whole and not read back by this step, so this saves the read-for-ownership a
// plain store costs (2 of the ~18 bytes a parameter the 8-bit step moves). Returns whether it streamed (the
// caller fences once at the end). Elsewhere (unaligned out, the scalar body) a plain copy.
inline bool stream_out(uint16_t* out, const uint16_t* buf, int64_t n) {
#if defined(DSFAST_8BIT_AVX512)
  constexpr int64_t kLane = 32;   // uint16 per 64-byte store
  if ((reinterpret_cast<uintptr_t>(out) & 63) == 0 && n % kLane == 0) {
    for (int64_t k = 0; k < n; k += kLane)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out + k), _mm512_load_si512(buf + k));
    return true;
  }
#elif defined(DSFAST_8BIT_AVX2)
  constexpr int64_t kLane = 16;   // uint16 per 32-byte store
  if ((reinterpret_cast<uintptr_t>(out) & 31) == 0 && n % kLane == 0) {
    for (int64_t k = 0; k < n; k += kLane)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + k),
                          _mm256_load_si256(reinterpret_cast<const __m256i*>(buf + k)));
    return true;
  }
#endif
  std::memcpy(out, buf, size_t(n) * 2);
  return false;
}

#if defined(DSFAST_8BIT_AVX2)
#define DSFAST_8BIT_WIDE 1
// AVX2 forms of decode_moments' and encode_moments' loops, 8 elements at a time (the same integer operations and
// fp32 multiplies, so the same bits); the rest below. Encode: rounded_code with the bias folded into the rounding
// add (a multiple of 2^20, so the arithmetic shift gives the same result), "q < 1 ? b : q" as max(q, b) for b in
// {0, 1} (q < 1 means q <= 0), and the exp_avg sign kept only where q >= 1, i.e. where u >= half_smallest (below
// it the value is under half of code 1, itself a 3-bit value, so q <= 0 there and b = 0).
inline int64_t decode_wide(const uint8_t* mc, const uint8_t* vc, float ms, float vs, int64_t n, float* m, float* v) {
  const Vec msv(ms), vsv(vs);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    decode_m_vec(mc + k, msv).store(m + k);
    decode_v_vec(vc + k, vsv).store(v + k);
  }
  return k;
}

template <bool Clamp>   // kernel_8bit_avx512.h's rounded_codes16
inline __m256i rounded_codes8(__m256i u, uint32_t bias) {
  if constexpr (Clamp) u = _mm256_min_epi32(u, splat8(0x3FF00000u));   // kCodeTop's bits (1.875f)
  return _mm256_srai_epi32(_mm256_add_epi32(u, splat8(0x80000u - (bias << 20))), 20);
}

// Finite: as kernel_8bit_avx512.h's encode_wide
template <bool Finite>
inline int64_t encode_wide(const float* m, const float* v, int64_t n, float m_inv, float v_inv, uint8_t* mc,
                           uint8_t* vc) {
  const __m256 miv = _mm256_set1_ps(m_inv), viv = _mm256_set1_ps(v_inv);
  const __m256i abs_mask = splat8(0x7FFFFFFFu), below_half = splat8(float_bits(kMomentHalfSmallest) - 1u);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i ux = _mm256_castps_si256(_mm256_loadu_ps(m + k));
    __m256i u = _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(ux, abs_mask)), miv));
    if constexpr (!Finite) u = _mm256_and_si256(u, abs_mask);
    const __m256i nonzero = _mm256_cmpgt_epi32(u, below_half);   // all ones where q != 0 (max(q, 1) there)
    __m256i q = _mm256_max_epi32(rounded_codes8<!Finite>(u, kMomentBias), _mm256_srli_epi32(nonzero, 31));
    q = _mm256_or_si256(q, _mm256_srli_epi32(_mm256_and_si256(_mm256_and_si256(ux, nonzero), splat8(0x80000000u)), 24));
    __m256i w = _mm256_castps_si256(_mm256_mul_ps(_mm256_loadu_ps(v + k), viv));
    if constexpr (!Finite) w = _mm256_and_si256(w, abs_mask);
    const __m256i r = _mm256_max_epi32(rounded_codes8<!Finite>(w, kSquareBias),
                                       _mm256_srli_epi32(_mm256_cmpgt_epi32(w, _mm256_setzero_si256()), 31));
    // dwords per 128-bit lane after the two packs: (m0-3, v0-3, ..) | (m4-7, v4-7, ..); reorder to m0-7, v0-7
    const __m256i w16 = _mm256_packus_epi32(q, r);
    const __m256i b8 = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(w16, w16), order);
    const __m128i lo = _mm256_castsi256_si128(b8);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(mc + k), lo);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(vc + k), _mm_unpackhi_epi64(lo, lo));
  }
  return k;
}
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
  // kCodeTop / absmax, at most FLT_MAX: a block of tiny moments (absmax below about 5.5e-39) would otherwise get
  // an infinite inverse, and its zeros 0 * inf = NaN, the top code
  const float big = 3.4028235e38f;   // FLT_MAX
  const float m_inv = m_abs > 0.0f ? std::min(kCodeTop / m_abs, big) : 0.0f;
  const float v_inv = v_abs > 0.0f ? std::min(kCodeTop / v_abs, big) : 0.0f;
  const int32_t half_smallest = int32_t(float_bits(kMomentHalfSmallest));
  int64_t k = 0;
#ifdef DSFAST_8BIT_WIDE
  if (m_abs <= big && v_abs <= big) k = encode_wide<true>(m, v, n, m_inv, v_inv, mc, vc);
  else k = encode_wide<false>(m, v, n, m_inv, v_inv, mc, vc);
#endif
  // |x| * inv's sign bit cleared: inf * 0 (a block holding an infinity has inv 0) is a NaN with the sign set, which
  // must clamp to the top code as any other NaN
  for (; k < n; ++k) {
    const uint32_t ux = float_bits(m[k]);
    const int32_t u = int32_t(float_bits(bits_float(ux & 0x7FFFFFFFu) * m_inv) & 0x7FFFFFFFu);
    int32_t q = rounded_code(u, int32_t(kMomentBias));
    q = q < 1 ? int32_t(u >= half_smallest) : q;
    mc[k] = uint8_t(q | (q ? int32_t((ux >> 24) & 128u) : 0));
    const int32_t w = int32_t(float_bits(bits_float(float_bits(v[k]) & 0x7FFFFFFFu) * v_inv) & 0x7FFFFFFFu);
    const int32_t r = rounded_code(w, int32_t(kSquareBias));
    vc[k] = uint8_t(r < 1 ? int32_t(w > 0) : r);
  }
}

// The fused pass over whole blocks of one (grad, out, param) combination with fp32 moments: per vector of W
// elements, decode both moments from their codes, the Adam update of kernel_body.h's adam_vec (the same
// adam_update on the same Vec, so the fp32-state kernel's bits), store the param / output, keep the fresh moments
// in a 2 KB L1 buffer and their |max| in registers; then encode the block from the buffer with that absmax.
// A block whose length is not a multiple of W (the tensor's last, short one) takes the unfused path below, and so
// does every block of the scalar body (W = 1), whose decode / absmax / encode loops the compiler vectorizes for SSE2.
template <int G, int O, int P>
void adam8bit_fused(const Adam8bitTensor& t, int64_t begin, int64_t end) {
  const AdamCoeffs c = t.coeffs;
  const uint32_t seed = t.round_seed;
  constexpr int W = Vec::W;
  alignas(64) float m[kQuantBlock], v[kQuantBlock];
  alignas(64) uint16_t out_buf[kQuantBlock];
  bool streamed = false;
  for (int64_t b0 = begin; b0 < end; b0 += kQuantBlock) {   // begin is a block start (dispatch.cpp)
    const int64_t n = end - b0 < kQuantBlock ? end - b0 : kQuantBlock;
    const int64_t blk = b0 / kQuantBlock;
    uint8_t* mc = t.exp_avg_codes + b0;
    uint8_t* vc = t.exp_avg_sq_codes + b0;
    void* p = static_cast<unsigned char*>(t.param) + b0 * bytes_of(P);
    const void* g = static_cast<const unsigned char*>(t.grad) + b0 * bytes_of(G);
    void* o = t.out16 ? static_cast<uint16_t*>(t.out16) + b0 : nullptr;
    float m_abs, v_abs;
    if (W > 1 && n % W == 0) {   // the scalar body keeps the separate loops: the compiler vectorizes them
      const Vec ms(t.exp_avg_scales[blk]), vs(t.exp_avg_sq_scales[blk]);
      AbsMax am, av;
      for (int64_t i = 0; i < n; i += W) {
        Vec mv = decode_m_vec(mc + i, ms), vv = decode_v_vec(vc + i, vs);
        Vec pv = load_as<P>(p, i);
        adam_update(pv, load_as<G>(g, i), mv, vv, c);
        store_param<P>(p, i, pv, seed, b0 + i);
        store_as<O>(out_buf, i, pv);
        mv.store(m + i);
        vv.store(v + i);
        am.add(mv);
        av.add(vv);
      }
      m_abs = bits_float(uint32_t(am.get()));
      v_abs = bits_float(uint32_t(av.get()));
      if constexpr (O != kNone) streamed |= stream_out(static_cast<uint16_t*>(o), out_buf, n);
    } else {
      decode_moments(mc, vc, t.exp_avg_scales[blk], t.exp_avg_sq_scales[blk], n, m, v);
      adam_span<G, O, P, kF32>(p, g, m, v, o, n, c, seed, b0);
      block_absmax(m, v, n, &m_abs, &v_abs);
    }
    encode_moments(m, v, n, m_abs, v_abs, mc, vc);
    // the scale is the value of the top code (kCodeTop), so decoding multiplies once
    t.exp_avg_scales[blk] = m_abs / kCodeTop;
    t.exp_avg_sq_scales[blk] = v_abs / kCodeTop;
  }
#if defined(DSFAST_8BIT_WIDE)
  if (streamed) _mm_sfence();   // the streamed outputs visible before this range returns (and its thread joins)
#else
  (void)streamed;
#endif
}

using Adam8bitFn = void (*)(const Adam8bitTensor&, int64_t, int64_t);
template <int G, int O, int P>
constexpr Adam8bitFn adam8bit_entry() {
  if constexpr (implemented(O, P, kF32)) return &adam8bit_fused<G, O, P>;
  else return nullptr;
}
// [param][grad][out]; params F32 / BF16 (the F16 plane unused), outputs BF16/F16/None (the F32 slot unused)
#define DSFAST_ROW(P, G) {adam8bit_entry<G, kF32, P>(), adam8bit_entry<G, kBF16, P>(), \
                          adam8bit_entry<G, kF16, P>(), adam8bit_entry<G, kNone, P>()}
#define DSFAST_GRID(P) {DSFAST_ROW(P, kF32), DSFAST_ROW(P, kBF16), DSFAST_ROW(P, kF16)}
constexpr Adam8bitFn kAdam8bitTable[3][3][4] = {DSFAST_GRID(kF32), DSFAST_GRID(kBF16), DSFAST_GRID(kF16)};
#undef DSFAST_ROW
#undef DSFAST_GRID

// Dtypes were validated by the dispatcher (dispatch.cpp) before any thread started.
inline void adam8bit_range(const Adam8bitTensor& t, int64_t begin, int64_t end) {
  kAdam8bitTable[int(t.param_dtype)][int(t.grad_dtype)][int(t.out_dtype)](t, begin, end);
}

}  // namespace DSFAST_ISA_NS
}  // namespace cpu
}  // namespace dsfast
