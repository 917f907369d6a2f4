// AVX-512F forms of kernel_8bit.h's decode and encode loops, 16 elements at a time: the compiler vectorizes the
// plain loops only 8 wide here (AVX-512F has no byte arithmetic, so it stops at 256-bit vectors), while
// vpmovzxbd / vpmovdb widen and narrow the codes directly. The same integer operations as the plain loops, so
// the codes are the same bits. Included by kernel_8bit.h, inside its namespace, where isa_avx512.cpp defines DSFAST_8BIT_AVX512.
#pragma once

#define DSFAST_8BIT_WIDE 1

inline __m512i splat(uint32_t x) { return _mm512_set1_epi32(int(x)); }

// kernel_8bit.h's rounded_code, 16 lanes
inline __m512i rounded_codes16(__m512i u, uint32_t bias) {
  u = _mm512_min_epi32(u, splat(0x3FF00000u));   // kCodeTop's bits (1.875f)
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 20), splat(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, splat(0x7FFFF)), odd);
  return _mm512_sub_epi32(_mm512_srai_epi32(r, 20), splat(bias));
}

inline int64_t decode_wide(const uint8_t* mc, const uint8_t* vc, float ms, float vs, int64_t n, float* m, float* v) {
  const __m512 msv = _mm512_set1_ps(ms), vsv = _mm512_set1_ps(vs);
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mc + k)));
    const __m512i mag = _mm512_and_si512(c, splat(127));
    const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(c, splat(128)), 24);
    const __m512i mb = _mm512_maskz_mov_epi32(
        _mm512_test_epi32_mask(mag, mag),
        _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(mag, splat(kMomentBias)), 20), sign));
    _mm512_storeu_ps(m + k, _mm512_mul_ps(_mm512_castsi512_ps(mb), msv));
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vc + k)));
    const __m512i vb = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(d, d),
                                              _mm512_slli_epi32(_mm512_add_epi32(d, splat(kSquareBias)), 20));
    _mm512_storeu_ps(v + k, _mm512_mul_ps(_mm512_castsi512_ps(vb), vsv));
  }
  return k;
}

inline int64_t encode_wide(const float* m, const float* v, int64_t n, float m_inv, float v_inv, uint8_t* mc,
                           uint8_t* vc) {
  const __m512 miv = _mm512_set1_ps(m_inv), viv = _mm512_set1_ps(v_inv);
  const __m512i one = splat(1), abs_mask = splat(0x7FFFFFFFu);
  const __m512i half_smallest = splat(float_bits(kMomentHalfSmallest));
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512i ux = _mm512_castps_si512(_mm512_loadu_ps(m + k));
    const __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(ux, abs_mask)), miv));
    __m512i q = rounded_codes16(u, kMomentBias);
    q = _mm512_mask_mov_epi32(q, _mm512_cmplt_epi32_mask(q, one),
                              _mm512_maskz_mov_epi32(_mm512_cmpge_epi32_mask(u, half_smallest), one));
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(ux, 24), splat(128));
    q = _mm512_or_si512(q, _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(q, q), sign));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(mc + k), _mm512_cvtepi32_epi8(q));
    const __m512i w = _mm512_castps_si512(
        _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(v + k)), abs_mask)),
                      viv));
    __m512i r = rounded_codes16(w, kSquareBias);
    r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epi32_mask(r, one),
                              _mm512_maskz_mov_epi32(_mm512_cmpgt_epi32_mask(w, _mm512_setzero_si512()), one));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(vc + k), _mm512_cvtepi32_epi8(r));
  }
  return k;
}
