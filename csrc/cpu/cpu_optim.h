// Public C++ API of the CPU optimizer kernels: plain pointers and sizes, no torch.
//
// A call takes a work list of tensors; the kernels split the concatenation of all of
// them evenly over the threads in ONE parallel region, so thousands of small tensors
// cost one fork/join, not one per tensor. Every tensor carries its own coefficients
// (param groups and per-parameter step counts may differ).
#pragma once

#include <cstdint>

#include "dsfast/optim_math.h"
#include "isa_support.h"

namespace dsfast {
namespace cpu {

enum class DType : int32_t { F32 = 0, BF16 = 1, F16 = 2, None = 3 };

// Instruction-set bodies. Auto picks the best one the running CPU supports. AVX512BF16 is the AVX-512 body compiled
// again with BW/VL/DQ and AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4 on): one instruction rounds 16 floats to
// bf16, and the 8-bit encode runs on 16-bit lanes; the same bits as the AVX512 body.
enum class Isa : int32_t { Scalar = 0, AVX2 = 1, AVX512 = 2, Auto = 3, AVX512BF16 = 4 };

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

// Adam/AdamW with 8-bit block-wise moments: each moment is one uint8 code per element, a minifloat relative to one
// fp32 scale per block of kQuantBlock elements (the block's absmax / kCodeTop). A magnitude code k >= 1 stands for
// 2^((k >> 3) - e0) * (1 + (k & 7) / 8) (3 mantissa bits; k = 0 is 0), so its nearest code is computed from the
// fp32 bits. exp_avg: sign in bit 7, 7-bit magnitude with e0 = 15 (E4M3-like: 2^-15 * 1.125 .. 1.875);
// exp_avg_sq: unsigned 8-bit magnitude with e0 = 31 (E5M3-like: 2^-31 * 1.125 .. 1.875), small second moments kept.
// Blocks start at element 0 of each tensor; the last one may be short. One pass per block decodes both moments into
// L1 buffers, runs adam_update (optim_math.h), re-encodes with the block's fresh absmax and writes the param and the
// optional 16-bit copy. Params F32 (with an optional out16) or BF16.
constexpr int64_t kQuantBlock = 256;
constexpr float kCodeTop = 1.875f;                      // the largest code's value (k = 127 / 255)
constexpr uint32_t kMomentBias = (127u - 15u) << 3;     // code k's fp32 bits are (k + bias) << 20
constexpr uint32_t kSquareBias = (127u - 31u) << 3;
constexpr float kMomentHalfSmallest = 1.125f / 65536.0f;  // half of exp_avg's code 1 (2^-15 * 1.125)
struct Adam8bitTensor {
  void* param;              // param_dtype (F32 or BF16), updated in place
  const void* grad;         // grad_dtype
  uint8_t* exp_avg_codes;   // numel codes
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
void adam8bit_step(const Adam8bitTensor* tensors, int64_t count, int num_threads, Isa isa);

bool isa_supported(Isa isa);  // compiled in AND runnable on this CPU
Isa best_isa();
const char* isa_name(Isa isa);
Isa parse_isa(const char* name);  // "auto", "avx512bf16", "avx512", "avx2", "scalar"; throws otherwise
bool openmp_enabled();

// Per-ISA bodies (isa_*.cpp): op##_range_##isa updates elements [begin, end) of one tensor. X(op, tensor type,
// isa suffix) once per optimizer, so a new ISA declares and defines all five in one line each.
#define DSFAST_ISA_BODIES(X, isa) \
  X(adam, AdamTensor, isa) X(sgd, SGDTensor, isa) X(adagrad, AdagradTensor, isa) X(lion, LionTensor, isa) \
  X(adam8bit, Adam8bitTensor, isa)
#define DSFAST_DECLARE_BODY(op, T, isa) void op##_range_##isa(const T& t, int64_t begin, int64_t end);
// In an isa_*.cpp, after kernel_body.h / kernel_8bit.h: the entry point calls that file's DSFAST_ISA_NS body.
#define DSFAST_DEFINE_BODY(op, T, isa) \
  void op##_range_##isa(const T& t, int64_t begin, int64_t end) { DSFAST_ISA_NS::op##_range(t, begin, end); }
DSFAST_ISA_BODIES(DSFAST_DECLARE_BODY, scalar)
#ifdef DSFAST_HAVE_X86_ISAS   // isa_support.h
DSFAST_ISA_BODIES(DSFAST_DECLARE_BODY, avx2)
DSFAST_ISA_BODIES(DSFAST_DECLARE_BODY, avx512)
#endif
#ifdef DSFAST_HAVE_AVX512BF16
DSFAST_ISA_BODIES(DSFAST_DECLARE_BODY, avx512bf16)
#endif

}  // namespace cpu
}  // namespace dsfast
