// One-lane "vector" over float: the portable fallback body and the reference the
// vector bodies are tested against. Same interface as simd_avx2.h / simd_avx512.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "dsfast/optim_math.h"
#include "half_convert.h"

namespace dsfast {
namespace cpu {
namespace scalar_isa {

struct Vec {
  static constexpr int W = 1;
  float v;
  Vec() = default;
  explicit Vec(float x) : v(x) {}

  static Vec load(const float* p) { return Vec(*p); }
  static Vec load_bf16(const uint16_t* p) { return Vec(bf16_to_float(*p)); }
  static Vec load_f16(const uint16_t* p) { return Vec(f16_to_float(*p)); }
  void store(float* p) const { *p = v; }
  void store_bf16(uint16_t* p) const { *p = float_to_bf16(v); }
  // stochastic rounding (half_convert.h); `index` is this lane's element index
  void store_bf16_stochastic(uint16_t* p, uint32_t seed, uint32_t index) const {
    *p = float_to_bf16_stochastic(v, round_bits(seed, index));
  }
  void store_f16(uint16_t* p) const { *p = float_to_f16(v); }

};

inline Vec operator+(Vec a, Vec b) { return Vec(a.v + b.v); }
inline Vec operator-(Vec a, Vec b) { return Vec(a.v - b.v); }
inline Vec operator*(Vec a, Vec b) { return Vec(a.v * b.v); }
inline Vec operator/(Vec a, Vec b) { return Vec(a.v / b.v); }
inline Vec dsfast_sqrt(Vec a) { return Vec(std::sqrt(a.v)); }
inline Vec dsfast_sign(Vec a) { return Vec(dsfast::dsfast_sign(a.v)); }

}  // namespace scalar_isa
}  // namespace cpu
}  // namespace dsfast
