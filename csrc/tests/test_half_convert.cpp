// Scalar bf16/fp16 conversions: round-to-nearest-even, NaN/inf/subnormal handling,
// checked against an independent rounding in double and (where the CPU has F16C)
// against the hardware conversion instructions.
#include <cmath>
#include <cstdint>
#include <random>

#include "check.h"
#include "half_convert.h"

using namespace dsfast::cpu;

// Nearest representable value by brute comparison, ties to the even pattern.
static uint16_t bf16_reference(float f) {
  uint32_t b = float_to_bits(f);
  uint16_t lo = uint16_t(b >> 16), hi = uint16_t(lo + 1);
  double dl = std::fabs(double(bf16_to_float(lo)) - f), dh = std::fabs(double(bf16_to_float(hi)) - f);
  if ((b & 0xffffu) == 0) return lo;
  if (std::isinf(bf16_to_float(hi)) && !std::isinf(f)) {
    // rounding past the largest finite value: inf only from the halfway point up
    return (b & 0xffffu) >= 0x8000u ? hi : lo;
  }
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo & 1u) ? hi : lo;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(float f) {
  return uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
static bool have_f16c() { __builtin_cpu_init(); return __builtin_cpu_supports("f16c"); }
#else
static bool have_f16c() { return false; }
static uint16_t hw_f32_to_f16(float) { return 0; }
static float hw_f16_to_f32(uint16_t) { return 0; }
#endif

static bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || float_to_bits(a) == float_to_bits(b);
}

int main() {
  // bf16: exact ties, NaN, inf, and random bit patterns
  CHECK(float_to_bf16(1.0f) == 0x3f80, "1.0");
  CHECK(float_to_bf16(bits_to_float(0x3f808000u)) == 0x3f80, "tie rounds to even (down)");
  CHECK(float_to_bf16(bits_to_float(0x3f818000u)) == 0x3f82, "tie rounds to even (up)");
  CHECK(float_to_bf16(bits_to_float(0x3f808001u)) == 0x3f81, "above tie rounds up");
  CHECK(float_to_bf16(INFINITY) == 0x7f80 && float_to_bf16(-INFINITY) == 0xff80, "inf");
  CHECK(std::isnan(bf16_to_float(float_to_bf16(NAN))), "NaN stays NaN");
  CHECK(std::isnan(bf16_to_float(float_to_bf16(bits_to_float(0x7f800001u)))), "signalling NaN with low payload");
  CHECK(float_to_bf16(bits_to_float(0x7f7fffffu)) == 0x7f80, "FLT_MAX rounds to inf");
  std::mt19937 rng(1234);
  for (int k = 0; k < 2000000; ++k) {
    float f = bits_to_float(rng());
    if (std::isnan(f)) continue;
    uint16_t got = float_to_bf16(f), want = bf16_reference(f);
    CHECK(got == want, "bf16(%a) = %04x, want %04x", f, got, want);
  }

  // fp16: all 65536 inputs back to float, and many floats forward, against F16C
  if (have_f16c()) {
    for (uint32_t h = 0; h < 65536; ++h) {
      CHECK(same_float(f16_to_float(uint16_t(h)), hw_f16_to_f32(uint16_t(h))), "f16_to_float(%04x)", h);
    }
    for (uint32_t e = 0; e < 256; ++e) {  // every exponent, a spread of mantissas (incl. ties)
      for (uint32_t m = 0; m < (1u << 23); m += 997) {
        for (uint32_t s : {0u, 0x80000000u}) {
          float f = bits_to_float(s | (e << 23) | m);
          uint16_t got = float_to_f16(f), want = hw_f32_to_f16(f);
          bool ok = std::isnan(f) ? std::isnan(f16_to_float(got)) : got == want;
          CHECK(ok, "f16(%a) = %04x, want %04x", f, got, want);
        }
      }
      for (uint32_t low : {0x0fffu, 0x1000u, 0x1001u, 0x3000u, 0x2000u}) {  // exact ties near every exponent
        float f = bits_to_float((e << 23) | low);
        if (!std::isnan(f)) CHECK(float_to_f16(f) == hw_f32_to_f16(f), "tie f16(%a)", f);
      }
    }
  } else {
    std::printf("F16C not available: fp16 hardware cross-check skipped\n");
  }
  CHECK(float_to_f16(65504.0f) == 0x7bff && float_to_f16(65520.0f) == 0x7c00, "fp16 max / overflow");
  CHECK(float_to_f16(5.9604645e-08f) == 0x0001, "smallest subnormal");
  CHECK(float_to_f16(2.98023224e-08f) == 0x0000, "half of smallest subnormal ties to zero");
  CHECK(std::isnan(f16_to_float(float_to_f16(NAN))), "fp16 NaN stays NaN");
  TEST_MAIN_END();
}
