// AVX-512F body. The target is set here, per file, so the build needs no
// special flags and the library still loads on CPUs without AVX-512 (the dispatcher only
// calls in after checking the running CPU). Standard headers come first, under the
// baseline target, so no library inline code gets compiled for AVX-512.
#if defined(__x86_64__) || defined(_M_X64)
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <immintrin.h>  // its intrinsics carry their own target attributes

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
// GCC 12 flags the intrinsics' own "undefined" placeholders; the ABI note is moot (all inline)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

#include "cpu_optim.h"
#include "simd_avx512.h"
#define DSFAST_ISA_NS avx512_isa
#include "kernel_body.h"
#define DSFAST_8BIT_AVX512 1   // kernel_8bit.h includes kernel_8bit_avx512.h
#include "kernel_8bit.h"

namespace dsfast {
namespace cpu {
void adam_range_avx512(const AdamTensor& t, int64_t b, int64_t e) { avx512_isa::adam_range(t, b, e); }
void sgd_range_avx512(const SGDTensor& t, int64_t b, int64_t e) { avx512_isa::sgd_range(t, b, e); }
void adagrad_range_avx512(const AdagradTensor& t, int64_t b, int64_t e) { avx512_isa::adagrad_range(t, b, e); }
void lion_range_avx512(const LionTensor& t, int64_t b, int64_t e) { avx512_isa::lion_range(t, b, e); }
void adam8bit_range_avx512(const Adam8bitTensor& t, int64_t b, int64_t e) { avx512_isa::adam8bit_range(t, b, e); }
}  // namespace cpu
}  // namespace dsfast

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
#endif
