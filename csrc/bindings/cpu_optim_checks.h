// Argument checks shared by the cpu_optim op's bindings (cpu_optim_*.cpp): each tensor checked
// against its parameter and mapped to the kernels' DType. Errors are ValueError/TypeError naming
// the tensor ("<label>[i]") and what would be valid.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "../cpu/cpu_optim.h"
#include "op_abi.h"

namespace dsfast {
// Shared by the op's own files only (the op is reached through the dispatcher): hidden, so that
// the library exports no more symbols than when they were one file's internals.
namespace __attribute__((visibility("hidden"))) cpu_bind {

using cpu::DType;
using namespace op;  // Tensor, Tensors, Flags, Text, value_error, type_error, ...

// Names tensor i in error messages. Built only when an error is raised: a step over
// thousands of tensors must not allocate a string per tensor.
struct Where {
  Text label;
  size_t i;
  operator std::string() const { return str(label) + "[" + std::to_string(i) + "]"; }
};
inline std::string operator+(const Where& w, const char* s) { return std::string(w) + s; }

inline DType grad_dtype(const Tensor& g, const Where& w) {
  switch (g.scalar_type()) {
    case ScalarType::Float: return DType::F32;
    case ScalarType::BFloat16: return DType::BF16;
    case ScalarType::Half: return DType::F16;
    default:
      type_error(w + ".grad has dtype " + dtype_name(g.scalar_type()) +
                 "; supported gradient dtypes are float32, bfloat16, float16");
  }
}

inline DType float_dtype(ScalarType t) {
  return t == ScalarType::Float ? DType::F32 : t == ScalarType::BFloat16 ? DType::BF16
       : t == ScalarType::Half ? DType::F16 : DType::None;
}

// An optimizer state: fp32, or the (16-bit) parameter's own dtype (bf16_optimizer_states,
// fp32_optimizer_states=False).
inline DType check_state(const Tensor& t, const Tensor& p, const Where& w, const char* what) {
  if (!t.defined()) value_error(w + " " + what + " is missing");
  if (!t.is_cpu()) value_error(w + " " + what + " is on " + device_name(t) + ", not cpu");
  const DType d = float_dtype(t.scalar_type());
  if (d != DType::F32 && t.scalar_type() != p.scalar_type())
    type_error(w + " " + what + " has dtype " + dtype_name(t.scalar_type()) + "; it must be float32 or the "
               "parameter's dtype (" + dtype_name(p.scalar_type()) + ")");
  if (!t.is_contiguous())
    value_error(w + " " + what + " is not contiguous; updating a contiguous copy would lose the update");
  if (t.numel() != p.numel())
    value_error(w + " " + what + " has " + std::to_string(t.numel()) + " elements but the parameter has " +
                std::to_string(p.numel()));
  return d;
}

// fp32 parameters, or bf16 / fp16 masters (bf16_master_weights_and_grads, fp16_master_weights_and_grads).
inline DType check_param(const Tensor& p, const Where& w) {
  if (!p.defined()) value_error(w + " is undefined");
  if (!p.is_cpu()) value_error(w + " is on device " + device_name(p) + "; CPU optimizers update cpu tensors only");
  const DType d = float_dtype(p.scalar_type());
  if (d == DType::None)
    type_error(w + " has dtype " + dtype_name(p.scalar_type()) + "; CPU optimizers update float32, bfloat16 or "
               "float16 parameters");
  if (!p.is_contiguous())
    value_error(w + " is not contiguous; updating a contiguous copy would silently lose the update");
  return d;
}

inline DType check_grad(const Tensor& g, const Tensor& p, const Where& w) {
  if (!g.defined()) value_error(w + ".grad is missing");
  if (!g.is_cpu()) value_error(w + ".grad is on " + device_name(g) + ", not cpu");
  DType d = grad_dtype(g, w);
  if (!same_sizes(g, p))
    value_error(w + ".grad has shape " + sizes_str(g) + " but the parameter has shape " + sizes_str(p));
  if (!g.is_contiguous()) value_error(w + ".grad is not contiguous; the kernel reads gradients in place");
  return d;
}

inline DType check_out(Tensors outs, size_t i, const Tensor& p, const Where& w, void** ptr) {
  *ptr = nullptr;
  if (outs.size() == 0) return DType::None;
  const Tensor& o = outs[i];
  if (!o.is_cpu()) value_error(w + " 16-bit output is on " + device_name(o));
  DType d;
  if (o.scalar_type() == ScalarType::BFloat16) d = DType::BF16;
  else if (o.scalar_type() == ScalarType::Half) d = DType::F16;
  else
    type_error(w + " 16-bit output has dtype " + dtype_name(o.scalar_type()) + "; it must be bfloat16 or float16");
  if (o.numel() != p.numel() || !o.is_contiguous())
    value_error(w + " 16-bit output must be contiguous with " + std::to_string(p.numel()) + " elements, got " +
                std::to_string(o.numel()));
  if (p.scalar_type() != ScalarType::Float)
    value_error(w + " has a 16-bit output but is itself " + dtype_name(p.scalar_type()) + ": a 16-bit master is its "
                "own 16-bit copy; pass no output for it");
  *ptr = o.mutable_data_ptr();
  return d;
}

inline void check_lengths(size_t n, std::initializer_list<std::pair<const char*, size_t>> others, size_t outs) {
  for (auto& [name, len] : others)
    if (len != n)
      value_error(std::string(name) + " has " + std::to_string(len) + " entries but there are " +
                  std::to_string(n) + " params");
  if (outs != 0 && outs != n)
    value_error("outs has " + std::to_string(outs) + " entries; pass [] or one per param (" + std::to_string(n) +
                ")");
}

inline float* step_counter(const Tensor& s, const Where& w) {
  if (!s.defined() || !s.is_cpu() || s.scalar_type() != ScalarType::Float || s.numel() != 1)
    value_error(w + " step must be a one-element float32 cpu tensor (torch's layout)");
  return static_cast<float*>(s.mutable_data_ptr());
}

inline void* data(const Tensor& t) { return t.mutable_data_ptr(); }

inline dsfast::cpu::Isa isa_arg(Text isa) {
  try {
    return dsfast::cpu::parse_isa(str(isa).c_str());
  } catch (const std::invalid_argument& e) {
    value_error(e.what());
  }
}

// Stochastic rounding: the call's seed (0: off) made distinct per row, for bf16 params only (others round to
// nearest even whatever the call asks: an optimizer's groups may mix dtypes).
inline uint32_t row_seed(int64_t seed, size_t row, DType param) {
  if (seed == 0 || param != DType::BF16) return 0;
  uint32_t x = uint32_t(seed) ^ uint32_t(uint64_t(seed) >> 32) ^ (uint32_t(row) * 0x85EBCA6Bu);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return x ? x : 1u;
}

}  // namespace cpu_bind
}  // namespace dsfast
