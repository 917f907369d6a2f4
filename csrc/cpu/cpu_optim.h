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

// Parameters (masters) and states are F32, or 16-bit (bf16 / fp16 masters: DeepSpeed's
// bf16_master_weights_and_grads, fp16_master_weights_and_grads; 16-bit states: bf16_optimizer_states,
// fp32_optimizer_states=false). Every element is computed in fp32 registers and rounded to nearest even
// on the store. Valid pairs (param, state): (F32, F32), (BF16, F32), (BF16, BF16), (F16, F32), (F16, F16);
// a 16-bit output (out16) only with F32 params (a 16-bit master is its own 16-bit copy). round_seed nonzero
// (BF16 params only): the params are rounded stochastically (half_convert.h), off (0) by default; the caller
// gives each tensor and step its own seed.
struct AdamTensor {
  void* param;         // param_dtype, updated in place
  const void* grad;    // grad_dtype (F32, BF16 or F16)
  void* exp_avg;       // state_dtype
  void* exp_avg_sq;    // state_dtype
  void* out16;         // optional copy of the updated param (BF16 or F16), or nullptr
  int64_t numel;
  DType grad_dtype;
  DType out_dtype;     // None when out16 is nullptr
  AdamCoeffs coeffs;
  DType param_dtype = DType::F32;
  DType state_dtype = DType::F32;
  uint32_t round_seed = 0;
};

struct SGDTensor {
  void* param;
  const void* grad;
  void* momentum_buf;  // state_dtype; unused (may be nullptr) when coeffs.momentum == 0
  void* out16;
  int64_t numel;
  DType grad_dtype;
  DType out_dtype;
  SGDCoeffs coeffs;
  DType param_dtype = DType::F32;
  DType state_dtype = DType::F32;
  uint32_t round_seed = 0;
};

// Updates with one state per element: Adagrad (state: the sum of squared gradients) and Lion (state: the
// momentum, DeepSpeed's exp_avg). Fields and precisions as SGDTensor's; the state is always present.
template <class Coeffs>
struct OneStateTensor {
  void* param;
  const void* grad;
  void* state;
  void* out16;
  int64_t numel;
  DType grad_dtype;
  DType out_dtype;
  Coeffs coeffs;
  DType param_dtype = DType::F32;
  DType state_dtype = DType::F32;
  uint32_t round_seed = 0;
};
using AdagradTensor = OneStateTensor<AdagradCoeffs>;
using LionTensor = OneStateTensor<LionCoeffs>;

// Adam/AdamW with 8-bit block-wise moments (bitsandbytes' / torchao's layout): each moment is one uint8 code per
// element, an index into a sorted 256-entry map of values in [-1, 1] (exp_avg: a signed map; exp_avg_sq: an
// unsigned one, so small second moments keep their resolution), times one fp32 scale per block of kQuantBlock
// elements (the block's absmax). Blocks start at element 0 of each tensor; the last one may be short. One pass per
// block dequantizes both moments into L1 buffers, runs adam_update (optim_math.h), requantizes with the block's fresh
// absmax and writes the param and the optional 16-bit copy. Params F32 (with an optional out16) or BF16.
constexpr int64_t kQuantBlock = 256;
struct Adam8bitTensor {
  void* param;              // param_dtype (F32 or BF16), updated in place
  const void* grad;         // grad_dtype
  uint8_t* exp_avg_codes;   // numel codes into m_map
  float* exp_avg_scales;    // ceil(numel / kQuantBlock) scales
  uint8_t* exp_avg_sq_codes;
  float* exp_avg_sq_scales;
  void* out16;
  int64_t numel;
  DType grad_dtype;
  DType out_dtype;
  AdamCoeffs coeffs;
  DType param_dtype = DType::F32;
  uint32_t round_seed = 0;
};
// The two maps: 256 ascending floats each, shared by every tensor of a call.
struct QuantMaps {
  const float* exp_avg;
  const float* exp_avg_sq;
};

// Whether the kernels implement this (param, state, out) combination (see above).
inline bool valid_precision(DType param, DType state, DType out) {
  if (param == DType::F32) return state == DType::F32;
  if (param != DType::BF16 && param != DType::F16) return false;
  return (state == DType::F32 || state == param) && out == DType::None;
}

// Runs the update over the whole work list. num_threads <= 0 means "all OpenMP threads".
// Throws std::invalid_argument for an ISA the CPU cannot run or a bad dtype.
void adam_step(const AdamTensor* tensors, int64_t count, int num_threads, Isa isa);
void sgd_step(const SGDTensor* tensors, int64_t count, int num_threads, Isa isa);
void adagrad_step(const AdagradTensor* tensors, int64_t count, int num_threads, Isa isa);
void lion_step(const LionTensor* tensors, int64_t count, int num_threads, Isa isa);
void adam8bit_step(const Adam8bitTensor* tensors, int64_t count, const QuantMaps& maps, int num_threads, Isa isa);

bool isa_supported(Isa isa);  // compiled in AND runnable on this CPU
Isa best_isa();
const char* isa_name(Isa isa);
Isa parse_isa(const char* name);  // "auto", "avx512", "avx2", "scalar"; throws otherwise
bool openmp_enabled();

// Per-ISA bodies (isa_*.cpp): update elements [begin, end) of one tensor.
void adam_range_scalar(const AdamTensor& t, int64_t begin, int64_t end);
void sgd_range_scalar(const SGDTensor& t, int64_t begin, int64_t end);
void adagrad_range_scalar(const AdagradTensor& t, int64_t begin, int64_t end);
void lion_range_scalar(const LionTensor& t, int64_t begin, int64_t end);
void adam8bit_range_scalar(const Adam8bitTensor& t, const QuantMaps& maps, int64_t begin, int64_t end);
#if defined(__x86_64__) || defined(_M_X64)
#define DSFAST_HAVE_X86_ISAS 1
void adam_range_avx2(const AdamTensor& t, int64_t begin, int64_t end);
void sgd_range_avx2(const SGDTensor& t, int64_t begin, int64_t end);
void adagrad_range_avx2(const AdagradTensor& t, int64_t begin, int64_t end);
void lion_range_avx2(const LionTensor& t, int64_t begin, int64_t end);
void adam8bit_range_avx2(const Adam8bitTensor& t, const QuantMaps& maps, int64_t begin, int64_t end);
void adam_range_avx512(const AdamTensor& t, int64_t begin, int64_t end);
void sgd_range_avx512(const SGDTensor& t, int64_t begin, int64_t end);
void adagrad_range_avx512(const AdagradTensor& t, int64_t begin, int64_t end);
void lion_range_avx512(const LionTensor& t, int64_t begin, int64_t end);
void adam8bit_range_avx512(const Adam8bitTensor& t, const QuantMaps& maps, int64_t begin, int64_t end);
#endif

}  // namespace cpu
}  // namespace dsfast
