// AVX-512F body, and (compiled again by isa_avx512bf16.cpp with DSFAST_AVX512_BF16) the AVX512BF16 body. The
// target is set here, per file, so the build needs no special flags and the library still loads on CPUs without
// AVX-512 (the dispatcher only calls in after checking the running CPU). Standard headers come first, under the
// baseline target, so no library inline code gets compiled for AVX-512.
#if defined(__x86_64__) || defined(_M_X64)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <immintrin.h>  // its intrinsics carry their own target attributes

#if defined(DSFAST_AVX512_BF16)
#define DSFAST_AVX512_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c"
#define DSFAST_ISA_NS avx512bf16_isa
#define DSFAST_ISA_SUFFIX avx512bf16
#else
#define DSFAST_AVX512_TARGET "avx512f,avx2,fma,f16c"
#define DSFAST_ISA_NS avx512_isa
#define DSFAST_ISA_SUFFIX avx512
#endif
// a pragma whose argument is a macro: _Pragma of the expanded text
#define DSFAST_STR(x) #x
#define DSFAST_PRAGMA(x) _Pragma(DSFAST_STR(x))

#if defined(__clang__)
DSFAST_PRAGMA(clang attribute push(__attribute__((target(DSFAST_AVX512_TARGET))), apply_to = function))
#elif defined(__GNUC__)
#pragma GCC push_options
// GCC 12 flags the intrinsics' own "undefined" placeholders; the ABI note is moot (all inline)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wpsabi"
DSFAST_PRAGMA(GCC target(DSFAST_AVX512_TARGET))
#endif

#include "cpu_optim.h"
#include "simd_avx512.h"
#include "kernel_body.h"
#define DSFAST_8BIT_AVX512 1   // kernel_8bit.h includes kernel_8bit_avx512.h
#include "kernel_8bit.h"

namespace dsfast {
namespace cpu {
DSFAST_ISA_BODIES(DSFAST_DEFINE_BODY, DSFAST_ISA_SUFFIX)
}  // namespace cpu
}  // namespace dsfast

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif
