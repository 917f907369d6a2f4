// Which instruction-set bodies this compiler can build (macros only: isa_avx512bf16.cpp reads it before its target
// pragma). The x86 bodies need an x86-64 target; the AVX512BF16 body needs the avx512bf16 target and
// __builtin_cpu_supports("avx512bf16"): GCC 10 / clang 9 on. An older compiler builds the others, and
// isa_supported(AVX512BF16) is false there.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#define DSFAST_HAVE_X86_ISAS 1
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10)
#define DSFAST_HAVE_AVX512BF16 1
#endif
#endif
