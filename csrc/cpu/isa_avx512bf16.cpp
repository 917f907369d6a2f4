// The AVX512BF16 body: isa_avx512.cpp compiled again for CPUs with AVX512_BF16 and BW/VL/DQ (cpu_optim.h's Isa).
#include "isa_support.h"   // macros only: nothing compiled before isa_avx512.cpp's target pragma
#ifdef DSFAST_HAVE_AVX512BF16
#define DSFAST_AVX512_BF16 1
#include "isa_avx512.cpp"
#endif
