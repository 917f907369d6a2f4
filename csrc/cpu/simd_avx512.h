// 16-lane float vector for AVX-512F (only F is needed: fp16 and bf16 conversions go through F-level instructions;
// with DSFAST_AVX512_BF16, vcvtneps2bf16 rounds to bf16). Include ONLY after isa_avx512.cpp's target pragma, in its
// DSFAST_ISA_NS.
#pragma once

#include <immintrin.h>
#include <cstdint>

namespace dsfast {
namespace cpu {
namespace DSFAST_ISA_NS {

struct Vec {
  static constexpr int W = 16;
  __m512 v;
  Vec() = default;
  Vec(__m512 x) : v(x) {}
  explicit Vec(float x) : v(_mm512_set1_ps(x)) {}

  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load_bf16(const uint16_t* p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static Vec load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store_bf16(uint16_t* p) const {
#if defined(DSFAST_AVX512_BF16)
    // vcvtneps2bf16 rounds to nearest even and quiets a NaN as below, but flushes a denormal to a signed zero:
    // a vector holding one (rare: a param near 1e-38) takes the integer path
    if (__builtin_expect(_mm512_fpclass_ps_mask(v, 0x20) == 0, 1)) {   // 0x20: denormal
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
      return;
    }
#endif
    // round to nearest even on the dropped 16 bits; NaN -> quiet NaN with its sign
    __m512i b = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_blend_epi32(is_nan, r, qnan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  // stochastic rounding: half_convert.h's round_bits / float_to_bf16_stochastic, 16 lanes
  void store_bf16_stochastic(uint16_t* p, uint32_t seed, uint32_t index) const {
    __m512i x = _mm512_add_epi32(_mm512_set1_epi32(int(index)),
                                 _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    x = _mm512_xor_si512(_mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x9E3779B1u))), _mm512_set1_epi32(int(seed)));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x85EBCA6Bu)));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 13));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0xC2B2AE35u)));
    x = _mm512_and_si512(_mm512_xor_si512(x, _mm512_srli_epi32(x, 16)), _mm512_set1_epi32(0xffff));
    __m512i b = _mm512_castps_si512(v);
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, x), 16);
    __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, qnan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  void store_f16(uint16_t* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

};

inline Vec operator+(Vec a, Vec b) { return _mm512_add_ps(a.v, b.v); }
inline Vec operator-(Vec a, Vec b) { return _mm512_sub_ps(a.v, b.v); }
inline Vec operator*(Vec a, Vec b) { return _mm512_mul_ps(a.v, b.v); }
inline Vec operator/(Vec a, Vec b) { return _mm512_div_ps(a.v, b.v); }
inline Vec dsfast_sqrt(Vec a) { return _mm512_sqrt_ps(a.v); }
// optim_math.h's dsfast_sign: +-1 with the sign bit of a where a is nonzero and not NaN, else a itself
inline Vec dsfast_sign(Vec a) {
  const __m512i bits = _mm512_castps_si512(a.v);
  const __m512i one = _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(int(0x80000000u))),
                                      _mm512_set1_epi32(0x3f800000));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, _mm512_setzero_ps(), _CMP_NEQ_OQ), a.v,
                              _mm512_castsi512_ps(one));
}

}  // namespace DSFAST_ISA_NS
}  // namespace cpu
}  // namespace dsfast
