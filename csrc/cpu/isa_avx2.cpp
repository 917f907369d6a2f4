// AVX2 + FMA + F16C body. The target is set here, per file, so the build needs no
// special flags and the library still loads on CPUs without AVX2 (the dispatcher only
// calls in after checking the running CPU). Standard headers come first, under the
// baseline target, so no library inline code gets compiled for AVX2.
#if defined(__x86_64__) || defined(_M_X64)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <immintrin.h>  // its intrinsics carry their own target attributes

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
// GCC 12 flags the intrinsics' own "undefined" placeholders; the ABI note is moot (all inline)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC target("avx2,fma,f16c")
#endif

#include "cpu_optim.h"
#include "simd_avx2.h"
#define DSFAST_ISA_NS avx2_isa
#include "kernel_body.h"
#define DSFAST_8BIT_AVX2 1     // kernel_8bit.h's AVX2 decode / absmax helpers
#include "kernel_8bit.h"

namespace dsfast {
namespace cpu {
DSFAST_ISA_BODIES(DSFAST_DEFINE_BODY, avx2)
}  // namespace cpu
}  // namespace dsfast

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif
