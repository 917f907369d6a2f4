// Dispatcher: validates the work list, picks the instruction-set body for the running
// CPU, and splits the concatenation of all tensors evenly over the threads in one
// OpenMP parallel region. Compiled with baseline flags (no ISA-specific code here).
#include "cpu_optim.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dsfast {
namespace cpu {

namespace {

// Thread boundaries are rounded down to this many elements inside a tensor, so each
// thread's span starts on a 64-byte line for fp32 and 16-bit arrays alike.
constexpr int64_t kAlign = 64;
// Below this many elements per thread, fork/join costs more than it saves.
constexpr int64_t kMinPerThread = 1 << 15;
// Elements per claimed chunk: ~0.1-0.3 ms of work, so claiming one costs nothing measurable.
constexpr int64_t kChunk = 1 << 18;

bool cpu_has(Isa isa) {
#if defined(DSFAST_HAVE_X86_ISAS) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  switch (isa) {
    case Isa::AVX512BF16:
#ifdef DSFAST_HAVE_AVX512BF16
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bf16") && cpu_has(Isa::AVX2);
#else
      return false;   // this compiler did not build the body (isa_support.h)
#endif
    case Isa::AVX512:
      return __builtin_cpu_supports("avx512f");
    case Isa::AVX2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    default:
      return isa == Isa::Scalar;
  }
#else
  return isa == Isa::Scalar;
#endif
}

Isa resolve(Isa isa) {
  if (isa == Isa::Auto) return best_isa();
  if (!isa_supported(isa)) {
    throw std::invalid_argument(std::string("isa='") + isa_name(isa) +
                                "' is not supported by this CPU or build; supported: best is '" +
                                isa_name(best_isa()) + "'");
  }
  return isa;
}

void check_dtypes(DType grad, DType out, const void* out_ptr, int64_t index) {
  if (grad != DType::F32 && grad != DType::BF16 && grad != DType::F16) {
    throw std::invalid_argument("tensor " + std::to_string(index) + ": gradient dtype code " +
                                std::to_string(int(grad)) + " is not F32/BF16/F16");
  }
  if (out != DType::BF16 && out != DType::F16 && out != DType::None) {
    throw std::invalid_argument("tensor " + std::to_string(index) + ": output dtype must be BF16, F16 or None");
  }
  if ((out == DType::None) != (out_ptr == nullptr)) {
    throw std::invalid_argument("tensor " + std::to_string(index) + ": out16 pointer and out_dtype disagree");
  }
}

template <class T>
void check_precision(const T& t, int64_t index) {
  check_dtypes(t.grad_dtype, t.out_dtype, t.out16, index);
  if (!valid_precision(t.param_dtype, t.state_dtype, t.out_dtype)) {
    throw std::invalid_argument("tensor " + std::to_string(index) + ": (param, state, out) dtype codes (" +
                                std::to_string(int(t.param_dtype)) + ", " + std::to_string(int(t.state_dtype)) +
                                ", " + std::to_string(int(t.out_dtype)) +
                                ") are not implemented; valid: fp32 params with fp32 states, or bf16/fp16 params "
                                "with fp32 states or states of their own dtype, and no 16-bit output");
  }
  if (t.round_seed != 0 && t.param_dtype != DType::BF16) {
    throw std::invalid_argument("tensor " + std::to_string(index) +
                                ": stochastic rounding (round_seed != 0) applies to bf16 params only");
  }
}

// Calls fn(tensor, begin, end) over disjoint spans covering every element exactly once.
// The concatenation of all tensors is cut into equal chunks (boundaries rounded down to
// kAlign elements inside a tensor) that threads claim from an atomic counter: on a shared
// machine a thread that loses its core leaves its remaining chunks to the others instead
// of holding up the whole step, as a static split would.
// Align: the rounding of boundaries inside a tensor (kQuantBlock for 8-bit states: a block is never split).
template <int64_t Align = kAlign, class T, class Fn>
void run_work_list(const T* ts, int64_t count, int num_threads, Fn fn) {
  std::vector<int64_t> prefix(count + 1, 0);
  for (int64_t k = 0; k < count; ++k) prefix[k + 1] = prefix[k] + ts[k].numel;
  const int64_t total = prefix[count];
  if (total == 0) return;

  int threads = num_threads;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_get_max_threads();
#else
  threads = 1;
#endif
  threads = int(std::max<int64_t>(1, std::min<int64_t>(threads, total / kMinPerThread)));
  const int64_t nchunks = std::max<int64_t>(threads, (total + kChunk - 1) / kChunk);

  // Start of chunk c: (tensor index, element offset within it).
  auto boundary = [&](int64_t c, int64_t* idx, int64_t* off) {
    if (c >= nchunks) { *idx = count; *off = 0; return; }
    const int64_t target = (int64_t)((__int128)total * c / nchunks);
    const int64_t k = int64_t(std::upper_bound(prefix.begin(), prefix.end(), target) - prefix.begin()) - 1;
    *idx = k;
    *off = (target - prefix[k]) / Align * Align;
  };
  auto run_chunk = [&](int64_t c) {
    int64_t i0, o0, i1, o1;
    boundary(c, &i0, &o0);
    boundary(c + 1, &i1, &o1);
    for (int64_t k = i0; k <= i1 && k < count; ++k) {
      const int64_t b = (k == i0) ? o0 : 0;
      const int64_t e = (k == i1) ? o1 : ts[k].numel;
      if (b < e) fn(ts[k], b, e);
    }
  };

  if (threads == 1) {
    for (int64_t c = 0; c < nchunks; ++c) run_chunk(c);
    return;
  }
#ifdef _OPENMP
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(threads)
  for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < nchunks;
       c = next.fetch_add(1, std::memory_order_relaxed)) {
    run_chunk(c);
  }
#endif
}

}  // namespace

bool isa_supported(Isa isa) {
  if (isa == Isa::Auto) return true;
#ifndef DSFAST_HAVE_X86_ISAS
  if (isa != Isa::Scalar) return false;
#endif
  return cpu_has(isa);
}

Isa best_isa() {
  static const Isa best = isa_supported(Isa::AVX512BF16) ? Isa::AVX512BF16
                          : isa_supported(Isa::AVX512) ? Isa::AVX512
                          : isa_supported(Isa::AVX2) ? Isa::AVX2
                                                     : Isa::Scalar;
  return best;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::AVX2: return "avx2";
    case Isa::AVX512: return "avx512";
    case Isa::AVX512BF16: return "avx512bf16";
    default: return "auto";
  }
}

Isa parse_isa(const char* name) {
  const std::string s(name ? name : "");
  if (s == "auto") return Isa::Auto;
  if (s == "avx512bf16") return Isa::AVX512BF16;
  if (s == "avx512") return Isa::AVX512;
  if (s == "avx2") return Isa::AVX2;
  if (s == "scalar") return Isa::Scalar;
  throw std::invalid_argument("isa='" + s + "' is not one of 'auto', 'avx512bf16', 'avx512', 'avx2', 'scalar'");
}

bool openmp_enabled() {
#ifdef _OPENMP
  return true;
#else
  return false;
#endif
}

namespace {
// The body of `op` for each ISA, in body_for's order. Where this build has no AVX512BF16 (or no x86) body, resolve()
// never picks that ISA, so its slot repeats a body that exists.
#if defined(DSFAST_HAVE_AVX512BF16)
#define DSFAST_BODIES(op) op##_range_scalar, op##_range_avx2, op##_range_avx512, op##_range_avx512bf16
#elif defined(DSFAST_HAVE_X86_ISAS)
#define DSFAST_BODIES(op) op##_range_scalar, op##_range_avx2, op##_range_avx512, op##_range_avx512
#else
#define DSFAST_BODIES(op) op##_range_scalar, op##_range_scalar, op##_range_scalar, op##_range_scalar
#endif

// The body for the requested ISA (resolve(): Auto is the best one; an unsupported one throws).
template <class Fn>
Fn body_for(Isa isa, Fn scalar, Fn avx2, Fn avx512, Fn avx512bf16) {
  switch (resolve(isa)) {
    case Isa::AVX512BF16: return avx512bf16;
    case Isa::AVX512: return avx512;
    case Isa::AVX2: return avx2;
    default: return scalar;
  }
}
}  // namespace

void adam_step(const AdamTensor* ts, int64_t count, int num_threads, Isa isa) {
  for (int64_t k = 0; k < count; ++k) check_precision(ts[k], k);
  run_work_list(ts, count, num_threads, body_for(isa, DSFAST_BODIES(adam)));
}

void sgd_step(const SGDTensor* ts, int64_t count, int num_threads, Isa isa) {
  for (int64_t k = 0; k < count; ++k) {
    check_precision(ts[k], k);
    if (ts[k].coeffs.momentum != 0.0f && ts[k].momentum_buf == nullptr && ts[k].numel > 0) {
      throw std::invalid_argument("tensor " + std::to_string(k) + ": momentum != 0 needs a momentum buffer");
    }
  }
  run_work_list(ts, count, num_threads, body_for(isa, DSFAST_BODIES(sgd)));
}

namespace {
// Adagrad and Lion: one state each, which every tensor of the call must have.
template <class T>
void check_one_state(const T* ts, int64_t count) {
  for (int64_t k = 0; k < count; ++k) {
    check_precision(ts[k], k);
    if (ts[k].state == nullptr && ts[k].numel > 0)
      throw std::invalid_argument("tensor " + std::to_string(k) + ": the optimizer state buffer is missing");
  }
}
}  // namespace

void adagrad_step(const AdagradTensor* ts, int64_t count, int num_threads, Isa isa) {
  check_one_state(ts, count);
  run_work_list(ts, count, num_threads, body_for(isa, DSFAST_BODIES(adagrad)));
}

void lion_step(const LionTensor* ts, int64_t count, int num_threads, Isa isa) {
  check_one_state(ts, count);
  run_work_list(ts, count, num_threads, body_for(isa, DSFAST_BODIES(lion)));
}

void adam8bit_step(const Adam8bitTensor* ts, int64_t count, int num_threads, Isa isa) {
  for (int64_t k = 0; k < count; ++k) {
    const Adam8bitTensor& t = ts[k];
    check_dtypes(t.grad_dtype, t.out_dtype, t.out16, k);
    if (t.param_dtype != DType::F32 && t.param_dtype != DType::BF16)
      throw std::invalid_argument("tensor " + std::to_string(k) + ": 8-bit states need float32 or bfloat16 params");
    if (t.param_dtype != DType::F32 && t.out_dtype != DType::None)
      throw std::invalid_argument("tensor " + std::to_string(k) + ": a bf16 master is its own 16-bit copy");
    if (t.round_seed != 0 && t.param_dtype != DType::BF16)
      throw std::invalid_argument("tensor " + std::to_string(k) +
                                  ": stochastic rounding (round_seed != 0) applies to bf16 params only");
    if (t.numel > 0 && !(t.exp_avg_codes && t.exp_avg_scales && t.exp_avg_sq_codes && t.exp_avg_sq_scales))
      throw std::invalid_argument("tensor " + std::to_string(k) + ": an 8-bit state buffer is missing");
  }
  run_work_list<kQuantBlock>(ts, count, num_threads, body_for(isa, DSFAST_BODIES(adam8bit)));
}
#undef DSFAST_BODIES

}  // namespace cpu
}  // namespace dsfast
