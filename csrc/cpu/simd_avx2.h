// 8-lane float vector for AVX2 + FMA + F16C. Include ONLY from a TU compiled for that
// target (isa_avx2.cpp sets it with a pragma), after the target pragma.
#pragma once

#include <immintrin.h>
#include <cstdint>

namespace dsfast {
namespace cpu {
namespace avx2_isa {

struct Vec {
  static constexpr int W = 8;
  __m256 v;
  Vec() = default;
  Vec(__m256 x) : v(x) {}
  explicit Vec(float x) : v(_mm256_set1_ps(x)) {}

  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static Vec load_bf16(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static Vec load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  void store_bf16(uint16_t* p) const {
    // round to nearest even on the dropped 16 bits; NaN -> quiet NaN with its sign
    __m256i b = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
    __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, qnan, is_nan);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  // stochastic rounding: half_convert.h's round_bits / float_to_bf16_stochastic, 8 lanes (elements index..index+7)
  void store_bf16_stochastic(uint16_t* p, uint32_t seed, uint32_t index) const {
    __m256i x = _mm256_add_epi32(_mm256_set1_epi32(int(index)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    x = _mm256_xor_si256(_mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x9E3779B1u))), _mm256_set1_epi32(int(seed)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x85EBCA6Bu)));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0xC2B2AE35u)));
    x = _mm256_and_si256(_mm256_xor_si256(x, _mm256_srli_epi32(x, 16)), _mm256_set1_epi32(0xffff));
    __m256i b = _mm256_castps_si256(v);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, x), 16);
    __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, qnan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
  void store_f16(uint16_t* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

};

inline Vec operator+(Vec a, Vec b) { return _mm256_add_ps(a.v, b.v); }
inline Vec operator-(Vec a, Vec b) { return _mm256_sub_ps(a.v, b.v); }
inline Vec operator*(Vec a, Vec b) { return _mm256_mul_ps(a.v, b.v); }
inline Vec operator/(Vec a, Vec b) { return _mm256_div_ps(a.v, b.v); }
inline Vec dsfast_sqrt(Vec a) { return _mm256_sqrt_ps(a.v); }
// optim_math.h's dsfast_sign: +-1 with the sign bit of a where a is nonzero and not NaN, else a itself
inline Vec dsfast_sign(Vec a) {
  const __m256 one = _mm256_or_ps(_mm256_and_ps(a.v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
  return _mm256_blendv_ps(a.v, one, _mm256_cmp_ps(a.v, _mm256_setzero_ps(), _CMP_NEQ_OQ));
}

}  // namespace avx2_isa
}  // namespace cpu
}  // namespace dsfast
