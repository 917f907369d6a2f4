// Portable body: compiled with the baseline flags, runs on any CPU.
#include "cpu_optim.h"
#include "simd_scalar.h"

#define DSFAST_ISA_NS scalar_isa
#include "kernel_body.h"

namespace dsfast {
namespace cpu {
void adam_range_scalar(const AdamTensor& t, int64_t b, int64_t e) { scalar_isa::adam_range(t, b, e); }
void sgd_range_scalar(const SGDTensor& t, int64_t b, int64_t e) { scalar_isa::sgd_range(t, b, e); }
}  // namespace cpu
}  // namespace dsfast
