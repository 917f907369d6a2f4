// Scalar float <-> bf16 / fp16 conversions, round-to-nearest-even, NaN stays NaN.
// Used by the scalar body and the C++ tests (the vector bodies use intrinsics).
#pragma once

#include <cstdint>
#include <cstring>

namespace dsfast {
namespace cpu {

inline float bits_to_float(uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t b; std::memcpy(&b, &f, 4); return b; }

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t b = float_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x0040u);  // quiet NaN, sign kept
  b += 0x7fffu + ((b >> 16) & 1u);
  return uint16_t(b >> 16);
}

// Stochastic rounding to bf16 (an opt-in of the CPU optimizers for bf16 masters): the 16 dropped bits are compared
// with 16 random bits, so a value rounds up with probability (dropped bits) / 2^16 and small updates survive on
// average. The bits are murmur3's finaliser over (seed, element index): reproducible, the same for every ISA and
// thread split. NaN stays a quiet NaN; a value next to the largest bf16 may round to inf, as its magnitude says.
inline uint32_t round_bits(uint32_t seed, uint32_t index) {
  uint32_t x = (index * 0x9E3779B1u) ^ seed;
  x ^= x >> 16;
  x *= 0x85EBCA6Bu;
  x ^= x >> 13;
  x *= 0xC2B2AE35u;
  x ^= x >> 16;
  return x & 0xffffu;
}

inline uint16_t float_to_bf16_stochastic(float f, uint32_t bits) {
  uint32_t b = float_to_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return uint16_t((b >> 16) | 0x0040u);
  return uint16_t((b + bits) >> 16);
}

inline float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t float_to_f16(float f) {
  uint32_t b = float_to_bits(f);
  uint16_t sign = uint16_t((b >> 16) & 0x8000u);
  uint32_t abs = b & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN, quiet
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    if (abs < 0x33000000u) return sign;  // < 2^-25 rounds to zero (ties at 2^-25 to even = 0)
    uint32_t e = abs >> 23;
    uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;  // e in [102, 112]: result = man >> (shift) with RNE
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return uint16_t(sign | q);
  }
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);  // RNE on the 13 dropped bits
  return uint16_t(sign | (((r >> 13) - (112u << 10)) & 0xffffu));
}

}  // namespace cpu
}  // namespace dsfast
