// AVX-512F forms of kernel_8bit.h's decode and encode loops, 16 elements at a time: the compiler vectorizes the
// plain loops only 8 wide here (AVX-512F has no byte arithmetic, so it stops at 256-bit vectors), while
// vpmovzxbd / vpmovdb widen and narrow the codes directly. The same integer operations as the plain loops, so
// the codes are the same bits. Included by kernel_8bit.h, inside its namespace, where isa_avx512.cpp defines DSFAST_8BIT_AVX512.
#pragma once

#define DSFAST_8BIT_WIDE 1

inline __m512i splat(uint32_t x) { return _mm512_set1_epi32(int(x)); }

// kernel_8bit.h's rounded_code, 16 lanes, with the bias folded into the rounding add (a multiple of 2^20: the
// arithmetic shift gives the same result). Clamp: false where the block's absmax is finite (encode_moments; its
// inverse always is), since then |x| * inv <= 1.875 * (1 + 2^-23), which rounds to the top code anyway.
template <bool Clamp>
inline __m512i rounded_codes16(__m512i u, uint32_t bias) {
  if constexpr (Clamp) u = _mm512_min_epi32(u, splat(0x3FF00000u));   // kCodeTop's bits (1.875f)
  return _mm512_srai_epi32(_mm512_add_epi32(u, splat(0x80000u - (bias << 20))), 20);
}

// One vector of each moment decoded from 16 codes: the value's bits (magnitude + bias) << 20 | sign << 31 where
// the magnitude is nonzero, times the scale (code 0's bits are 0, as decode_moments has them, so 0 * a NaN scale is
// NaN too). exp_avg in 3 ops: kMomentBias (0x380) has no bit in the magnitude's 7, so "+ bias" is "| bias"; the
// code sign-extended and shifted by 20 has the magnitude in bits 20..26 and the sign in 27..31, and one ternary
// logic op sets bits 27..29 (the bias) and clears 30, leaving the sign in 31.
inline __m512 decode_m16(const uint8_t* mc, __m512 ms) {
  static_assert(kMomentBias == 0x380u, "decode_m16's bit layout assumes exp_avg's bias 0x380");
  const __m512i c = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mc)));
  const __m512i x = _mm512_slli_epi32(c, 20);
  // bitwise (x & 0xBFFFFFFF) | 0x38000000: imm 0xBA is A & ~B | C with A = x, B = 0x40000000, C = 0x38000000
  const __m512i bits = _mm512_maskz_ternarylogic_epi32(_mm512_test_epi32_mask(c, splat(127)), x,
                                                       splat(0x40000000u), splat(0x38000000u), 0xBA);
  return _mm512_mul_ps(_mm512_castsi512_ps(bits), ms);
}
inline __m512 decode_v16(const uint8_t* vc, __m512 vs) {
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vc)));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(d, splat(kSquareBias)), 20);
  return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_maskz_mov_epi32(_mm512_test_epi32_mask(d, d), bits)), vs);
}

inline int64_t decode_wide(const uint8_t* mc, const uint8_t* vc, float ms, float vs, int64_t n, float* m, float* v) {
  const __m512 msv = _mm512_set1_ps(ms), vsv = _mm512_set1_ps(vs);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    _mm512_storeu_ps(m + k, decode_m16(mc + k, msv));
    _mm512_storeu_ps(v + k, decode_v16(vc + k, vsv));
  }
  return k;
}

#if defined(DSFAST_AVX512_BF16)
// Encode of a finite block (see encode_wide), 32 elements a step on 16-bit lanes (AVX512BW): rounded_code reads
// only the product's bits above bit 19 (the add of 0x80000 carries upwards, the shift drops bits 0..19), so the
// high 16 bits of each product give the same code, with the bias and the half in units of 2^16. The high halves
// of two vectors of products go into one vector of 32 words in order (word i: element k + i). exp_avg: the
// product keeps x's sign (inv > 0), the magnitude is its word's low 15 bits; half_smallest's low 16 bits are 0, so
// the "nonzero" comparison is exact on the high word. exp_avg_sq: "w > 0" on the 32-bit products (a positive w
// below 2^-133, a denormal, has a zero high word).
inline __m512i high_words(__m512 a, __m512 b) {
  const __m512i odd = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33,
                                       31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_epi16(_mm512_castps_si512(a), odd, _mm512_castps_si512(b));
}
inline __m512i rounded_codes32(__m512i h, uint32_t bias) {   // rounded_code of each word's fp32 (finite, >= 0)
  return _mm512_srai_epi16(_mm512_add_epi16(h, _mm512_set1_epi16(short(0x8 - (bias << 4)))), 4);
}
inline int64_t encode_finite32(const float* m, const float* v, int64_t n, float m_inv, float v_inv, uint8_t* mc,
                               uint8_t* vc) {
  const __m512 miv = _mm512_set1_ps(m_inv), viv = _mm512_set1_ps(v_inv);
  const __m512i one = _mm512_set1_epi16(1), zero = _mm512_setzero_si512();
  const __m512i half_smallest = _mm512_set1_epi16(short(float_bits(kMomentHalfSmallest) >> 16));
  const __m512i halves = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);   // after packus: m's 32 bytes, then v's
  static_assert((__builtin_bit_cast(uint32_t, kMomentHalfSmallest) & 0xFFFFu) == 0, "half_smallest: 16 bits");
  int64_t k = 0;
  for (; k + 32 <= n; k += 32) {
    const __m512i hm = high_words(_mm512_mul_ps(_mm512_loadu_ps(m + k), miv),
                                  _mm512_mul_ps(_mm512_loadu_ps(m + k + 16), miv));
    const __m512i a = _mm512_and_si512(hm, _mm512_set1_epi16(0x7FFF));
    const __mmask32 nonzero = _mm512_cmpge_epi16_mask(a, half_smallest);
    __m512i q = _mm512_maskz_max_epi16(nonzero, rounded_codes32(a, kMomentBias), one);
    q = _mm512_mask_add_epi16(q, _mm512_mask_cmplt_epi16_mask(nonzero, hm, zero), q, _mm512_set1_epi16(128));
    const __m512 w0 = _mm512_mul_ps(_mm512_loadu_ps(v + k), viv);
    const __m512 w1 = _mm512_mul_ps(_mm512_loadu_ps(v + k + 16), viv);
    const __mmask32 positive = _mm512_kunpackw(_mm512_cmpgt_epi32_mask(_mm512_castps_si512(w1), zero),
                                               _mm512_cmpgt_epi32_mask(_mm512_castps_si512(w0), zero));
    const __m512i r = _mm512_maskz_max_epi16(positive, rounded_codes32(high_words(w0, w1), kSquareBias), one);
    const __m512i b = _mm512_permutexvar_epi64(halves, _mm512_packus_epi16(q, r));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mc + k), _mm512_castsi512_si256(b));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(vc + k), _mm512_extracti64x4_epi64(b, 1));
  }
  return k;
}
#endif

// Encode, 16 lanes. exp_avg: "q < 1 ? (u >= half_smallest) : q" is max(q, 1) where u >= half_smallest and 0
// elsewhere (there the value is below half of code 1, itself a 3-bit value, so q <= 0); the sign bit only where
// x < 0 and q != 0. exp_avg_sq: "r < 1 ? (w > 0) : r" is max(r, 1) where w > 0 and 0 elsewhere (w <= 0: r < 0).
// Finite (both absmaxes finite): no clamp, and no sign to clear from the products (encode_moments clears it, for
// inf * 0 = -NaN): v >= +0 there (a finite block holds no NaN, and beta2 * v + (1 - beta2) * g * g of v >= +0 is
// never -0).
template <bool Finite>
inline int64_t encode_wide(const float* m, const float* v, int64_t n, float m_inv, float v_inv, uint8_t* mc,
                           uint8_t* vc) {
  const __m512 miv = _mm512_set1_ps(m_inv), viv = _mm512_set1_ps(v_inv);
  const __m512i one = splat(1), abs_mask = splat(0x7FFFFFFFu), zero = _mm512_setzero_si512();
  const __m512i half_smallest = splat(float_bits(kMomentHalfSmallest));
  int64_t k = 0;
#if defined(DSFAST_AVX512_BF16)
  if constexpr (Finite) k = encode_finite32(m, v, n, m_inv, v_inv, mc, vc);   // whole 32s; the rest below
#endif
  for (; k + 16 <= n; k += 16) {
    const __m512i ux = _mm512_castps_si512(_mm512_loadu_ps(m + k));
    __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(ux, abs_mask)), miv));
    if constexpr (!Finite) u = _mm512_and_si512(u, abs_mask);
    const __mmask16 nonzero = _mm512_cmpge_epi32_mask(u, half_smallest);   // q != 0 exactly there
    __m512i q = _mm512_maskz_max_epi32(nonzero, rounded_codes16<!Finite>(u, kMomentBias), one);
    const __mmask16 neg = _mm512_mask_cmplt_epi32_mask(nonzero, ux, zero);
    q = _mm512_mask_or_epi32(q, neg, q, splat(128));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(mc + k), _mm512_cvtepi32_epi8(q));
    __m512i w = _mm512_castps_si512(_mm512_mul_ps(_mm512_loadu_ps(v + k), viv));
    if constexpr (!Finite) w = _mm512_and_si512(w, abs_mask);
    const __m512i r =
        _mm512_maskz_max_epi32(_mm512_cmpgt_epi32_mask(w, zero), rounded_codes16<!Finite>(w, kSquareBias), one);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(vc + k), _mm512_cvtepi32_epi8(r));
  }
  return k;
}
