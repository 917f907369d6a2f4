// The one binding style of dsfast's native ops: TORCH_LIBRARY operators in the `dsfast`
// namespace, written once against the names below and compiled for either of torch's ABIs.
//
//   DSFAST_STABLE_ABI=1 (torch >= 2.10): torch's stable C ABI (torch/csrc/stable). The
//     binary works with every torch from the targeted version on, and the binding parses
//     in well under a second (no ATen/c10 headers).
//   otherwise: the classic C++ API (ATen/core/Tensor.h + torch/library.h), for older torch.
//
// The loader (dsfast/ops/jit.py) picks the ABI and passes -DDSFAST_STABLE_ABI; the cache key
// and `dsfast report` record it. Both variants see the same accessors: defined(),
// is_cpu(), is_cuda(), get_device(), scalar_type(), numel(), dim(), size(i),
// is_contiguous(), mutable_data_ptr(), const_data_ptr().
//
// Errors: value_error() surfaces as Python's ValueError. type_error() is a TypeError in the
// classic ABI; the stable ABI can only throw std exceptions, so there it is a RuntimeError
// tagged with kTypeErrorTag that dsfast's Python wrappers (dsfast/ops/native) re-raise as
// TypeError.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#if DSFAST_STABLE_ABI
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#else
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#endif

namespace dsfast {
namespace op {

constexpr const char* kTypeErrorTag = "[dsfast:TypeError] ";

#if DSFAST_STABLE_ABI
using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
using Tensors = const std::vector<Tensor>&;           // Tensor[]
using Flags = const std::vector<bool>&;               // bool[]
using Text = const std::string&;                      // str
using OptTensor = const std::optional<Tensor>&;       // Tensor?
constexpr const char* kAbi = "stable";

[[noreturn]] inline void value_error(const std::string& msg) { throw std::invalid_argument(msg); }
[[noreturn]] inline void type_error(const std::string& msg) { throw std::runtime_error(kTypeErrorTag + msg); }

// A new float32/uint8 tensor on `like`'s device.
inline Tensor new_tensor(const Tensor& like, std::vector<int64_t> sizes, ScalarType dtype) {
  return torch::stable::new_empty(like, torch::headeronly::IntHeaderOnlyArrayRef(sizes), dtype);
}

#define DSFAST_LIBRARY(m) STABLE_TORCH_LIBRARY_FRAGMENT(dsfast, m)
#define DSFAST_LIBRARY_IMPL(key, m) STABLE_TORCH_LIBRARY_IMPL(dsfast, key, m)
#define DSFAST_KERNEL(fn) TORCH_BOX(&fn)
#else
using Tensor = at::Tensor;
using ScalarType = c10::ScalarType;
using Tensors = at::TensorList;
using Flags = const c10::List<bool>&;
using Text = c10::string_view;
using OptTensor = const std::optional<at::Tensor>&;
constexpr const char* kAbi = "classic";

[[noreturn]] inline void value_error(const std::string& msg) { TORCH_CHECK_VALUE(false, msg); }
[[noreturn]] inline void type_error(const std::string& msg) { TORCH_CHECK_TYPE(false, msg); }

inline Tensor new_tensor(const Tensor& like, std::vector<int64_t> sizes, ScalarType dtype) {
  return at::empty(sizes, like.options().dtype(dtype));
}

#define DSFAST_LIBRARY(m) TORCH_LIBRARY_FRAGMENT(dsfast, m)
#define DSFAST_LIBRARY_IMPL(key, m) TORCH_LIBRARY_IMPL(dsfast, key, m)
#define DSFAST_KERNEL(fn) TORCH_FN(fn)
#endif

inline std::string str(Text t) { return std::string(t.data(), t.size()); }

inline const char* dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return "torch.float32";
    case ScalarType::Double: return "torch.float64";
    case ScalarType::Half: return "torch.float16";
    case ScalarType::BFloat16: return "torch.bfloat16";
    case ScalarType::Int: return "torch.int32";
    case ScalarType::Long: return "torch.int64";
    case ScalarType::Short: return "torch.int16";
    case ScalarType::Char: return "torch.int8";
    case ScalarType::Byte: return "torch.uint8";
    case ScalarType::Bool: return "torch.bool";
    default: return "a dtype other than float32/float16/bfloat16";
  }
}

inline std::string device_name(const Tensor& t) {
  if (t.is_cpu()) return "cpu";
  if (t.is_cuda()) return "cuda:" + std::to_string(int(t.get_device()));
  return "a non-cpu, non-cuda device";
}

inline std::string sizes_str(const Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

inline bool same_sizes(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != b.size(d)) return false;
  return true;
}

}  // namespace op
}  // namespace dsfast
