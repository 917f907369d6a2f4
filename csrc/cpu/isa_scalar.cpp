// Portable body: compiled with the baseline flags, runs on any CPU.
#include "cpu_optim.h"
#include "simd_scalar.h"

#define DSFAST_ISA_NS scalar_isa
#include "kernel_body.h"
#include "kernel_8bit.h"

namespace dsfast {
namespace cpu {
void adam_range_scalar(const AdamTensor& t, int64_t b, int64_t e) { scalar_isa::adam_range(t, b, e); }
void sgd_range_scalar(const SGDTensor& t, int64_t b, int64_t e) { scalar_isa::sgd_range(t, b, e); }
void adagrad_range_scalar(const AdagradTensor& t, int64_t b, int64_t e) { scalar_isa::adagrad_range(t, b, e); }
void lion_range_scalar(const LionTensor& t, int64_t b, int64_t e) { scalar_isa::lion_range(t, b, e); }
void adam8bit_range_scalar(const Adam8bitTensor& t, int64_t b, int64_t e) { scalar_isa::adam8bit_range(t, b, e); }
}  // namespace cpu
}  // namespace dsfast
