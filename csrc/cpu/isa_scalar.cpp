// Portable body: compiled with the baseline flags, runs on any CPU.
#include "cpu_optim.h"
#include "simd_scalar.h"

#define DSFAST_ISA_NS scalar_isa
#include "kernel_body.h"
#include "kernel_8bit.h"

namespace dsfast {
namespace cpu {
DSFAST_ISA_BODIES(DSFAST_DEFINE_BODY, scalar)
}  // namespace cpu
}  // namespace dsfast
