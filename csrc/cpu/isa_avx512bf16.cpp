// The AVX512BF16 body: isa_avx512.cpp compiled again for CPUs with AVX512_BF16 and BW/VL/DQ (cpu_optim.h's Isa).
#define DSFAST_AVX512_BF16 1
#include "isa_avx512.cpp"
