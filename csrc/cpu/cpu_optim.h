// Public C++ API of the CPU optimizer kernels: plain pointers and sizes, no torch.
//
// A call takes a work list of tensors; the kernels split the concatenation of all of
// them evenly over the threads in ONE parallel region, so thousands of small tensors
// cost one fork/join, not one per tensor. Every tensor carries its own coefficients
// (param groups and per-parameter step counts may differ).
#pragma once

#include <cstdint>

#include "dsfast/optim_math.h"

namespace dsfast {
namespace cpu {

enum class DType : int32_t { F32 = 0, BF16 = 1, F16 = 2, None = 3 };

// Instruction-set bodies. Auto picks the best one the running CPU supports.
enum class Isa : int32_t { Scalar = 0, AVX2 = 1, AVX512 = 2, Auto = 3 };

struct AdamTensor {
  float* param;        // fp32, updated in place
  const void* grad;    // grad_dtype (F32, BF16 or F16)
  float* exp_avg;      // fp32
  float* exp_avg_sq;   // fp32
  void* out16;         // optional copy of the updated param (BF16 or F16), or nullptr
  int64_t numel;
  DType grad_dtype;
  DType out_dtype;     // None when out16 is nullptr
  AdamCoeffs coeffs;
};

struct SGDTensor {
  float* param;
  const void* grad;
  float* momentum_buf;  // fp32; unused (may be nullptr) when coeffs.momentum == 0
  void* out16;
  int64_t numel;
  DType grad_dtype;
  DType out_dtype;
  SGDCoeffs coeffs;
};

// Runs the update over the whole work list. num_threads <= 0 means "all OpenMP threads".
// Throws std::invalid_argument for an ISA the CPU cannot run or a bad dtype.
void adam_step(const AdamTensor* tensors, int64_t count, int num_threads, Isa isa);
void sgd_step(const SGDTensor* tensors, int64_t count, int num_threads, Isa isa);

bool isa_supported(Isa isa);  // compiled in AND runnable on this CPU
Isa best_isa();
const char* isa_name(Isa isa);
Isa parse_isa(const char* name);  // "auto", "avx512", "avx2", "scalar"; throws otherwise
bool openmp_enabled();

// Per-ISA bodies (isa_*.cpp): update elements [begin, end) of one tensor.
void adam_range_scalar(const AdamTensor& t, int64_t begin, int64_t end);
void sgd_range_scalar(const SGDTensor& t, int64_t begin, int64_t end);
#if defined(__x86_64__) || defined(_M_X64)
#define DSFAST_HAVE_X86_ISAS 1
void adam_range_avx2(const AdamTensor& t, int64_t begin, int64_t end);
void sgd_range_avx2(const SGDTensor& t, int64_t begin, int64_t end);
void adam_range_avx512(const AdamTensor& t, int64_t begin, int64_t end);
void sgd_range_avx512(const SGDTensor& t, int64_t begin, int64_t end);
#endif

}  // namespace cpu
}  // namespace dsfast
