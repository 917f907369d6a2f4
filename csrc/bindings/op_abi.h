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
#include <tuple>
#include <type_traits>
#include <utility>
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
using ScalarType = torch::headeronly::ScalarType;
using Flags = const std::vector<bool>&;                             // bool[]
using Text = const std::string&;                                    // str
using OwnedTensor = torch::stable::Tensor;                           // a single Tensor argument or result
using OptTensor = const std::optional<OwnedTensor>&;                // Tensor?
constexpr const char* kAbi = "stable";

#define DSFAST_SHIM(call) STABLE_TORCH_ERROR_CODE_CHECK(call)

// A tensor of a Tensor[] argument, read through the stable C shim without owning it.
// torch::stable::Tensor would allocate a shared_ptr per tensor: ~50 ns each, 0.5 ms of a
// 2000-parameter Adam step's five lists.
class Tensor {
 public:
  explicit Tensor(AtenTensorHandle h) : h_(h) {}
  bool defined() const { bool r; DSFAST_SHIM(aoti_torch_is_defined(h_, &r)); return r; }
  bool is_cpu() const {
    static const int32_t cpu = aoti_torch_device_type_cpu();
    return device_type() == cpu;
  }
  bool is_cuda() const {
    static const int32_t cuda = aoti_torch_device_type_cuda();
    return device_type() == cuda;
  }
  int32_t get_device() const { int32_t r; DSFAST_SHIM(aoti_torch_get_device_index(h_, &r)); return r; }
  ScalarType scalar_type() const {
    int32_t d;
    DSFAST_SHIM(aoti_torch_get_dtype(h_, &d));
    // the kernels' dtypes without the generic conversion (a chain of shim calls per tensor)
    static const int32_t f32 = aoti_torch_dtype_float32(), bf16 = aoti_torch_dtype_bfloat16(),
                         f16 = aoti_torch_dtype_float16();
    if (d == f32) return ScalarType::Float;
    if (d == bf16) return ScalarType::BFloat16;
    if (d == f16) return ScalarType::Half;
    return torch::stable::detail::to<ScalarType>(torch::stable::detail::from(d));
  }
  int64_t numel() const { int64_t r; DSFAST_SHIM(aoti_torch_get_numel(h_, &r)); return r; }
  int64_t dim() const { int64_t r; DSFAST_SHIM(aoti_torch_get_dim(h_, &r)); return r; }
  int64_t size(int64_t d) const { int64_t r; DSFAST_SHIM(aoti_torch_get_size(h_, d, &r)); return r; }
  bool is_contiguous() const { bool r; DSFAST_SHIM(aoti_torch_is_contiguous(h_, &r)); return r; }
  void* mutable_data_ptr() const { void* r; DSFAST_SHIM(aoti_torch_get_data_ptr(h_, &r)); return r; }
  const void* const_data_ptr() const { return mutable_data_ptr(); }
  AtenTensorHandle handle() const { return h_; }

 private:
  int32_t device_type() const { int32_t r; DSFAST_SHIM(aoti_torch_get_device_type(h_, &r)); return r; }
  AtenTensorHandle h_;
};

// A Tensor[] argument: takes ownership of the list and its tensor handles off the stack.
class TensorList {
 public:
  explicit TensorList(StableIValue v) {
    auto list = torch::stable::detail::to<StableListHandle>(v);
    size_t n = 0;
    AOTITorchError err = torch_list_size(list, &n);
    handles_.reserve(n);
    for (size_t i = 0; err == AOTI_TORCH_SUCCESS && i < n; ++i) {
      StableIValue item;
      err = torch_list_get_item(list, i, &item);
      if (err == AOTI_TORCH_SUCCESS) handles_.push_back(torch::stable::detail::to<AtenTensorHandle>(item));
    }
    torch_delete_list(list);
    if (err != AOTI_TORCH_SUCCESS) throw std::runtime_error("dsfast: cannot read a Tensor[] argument");
  }
  TensorList(TensorList&& o) noexcept : handles_(std::move(o.handles_)) {}
  TensorList(const TensorList&) = delete;
  ~TensorList() { release(); }
  // Drop the handles now (the caller's list keeps the tensors alive). Kernels call this before a long
  // pass over memory: freed afterwards, each handle and TensorImpl would be a cache miss (~5 ms for the
  // 12000 tensors of a 2000-parameter Adam step).
  void release() const {
    for (AtenTensorHandle h : handles_) aoti_torch_delete_tensor_object(h);
    handles_.clear();
  }
  size_t size() const { return handles_.size(); }
  bool empty() const { return handles_.empty(); }
  Tensor operator[](size_t i) const { return Tensor(handles_[i]); }

 private:
  mutable std::vector<AtenTensorHandle> handles_;
};
using Tensors = const TensorList&;                                   // Tensor[]
template <typename... L>
inline void release_lists(const L&... lists) { (lists.release(), ...); }

// TORCH_BOX with TensorList for Tensor[]; everything else converts as TORCH_BOX converts it.
template <typename T>
T unbox(StableIValue v) {
  if constexpr (std::is_same_v<T, TensorList>) return TensorList(v);
  else return torch::stable::detail::to<T>(v);
}

template <typename T>
struct is_tuple : std::false_type {};
template <typename... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

template <typename R, typename... A, size_t... I>
void call_unboxed(R (*fn)(A...), StableIValue* stack, std::index_sequence<I...>) {
  // braced initialisation converts the arguments in order, each exactly once
  std::tuple<std::decay_t<A>...> args{unbox<std::decay_t<A>>(stack[I])...};
  if constexpr (std::is_void_v<R>) {
    std::apply(fn, args);
  } else if constexpr (is_tuple<R>::value) {
    R out = std::apply(fn, args);
    std::apply([&](auto&... r) { size_t k = 0; ((stack[k++] = torch::stable::detail::from(r)), ...); }, out);
  } else {
    stack[0] = torch::stable::detail::from(std::apply(fn, args));
  }
}

template <auto Fn>
struct Boxed;
template <typename R, typename... A, R (*Fn)(A...)>
struct Boxed<Fn> {
  static void call(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
    STD_TORCH_CHECK(num_args == sizeof...(A), "dsfast: the schema has ", num_args, " arguments, the kernel ",
                    sizeof...(A));
    (void)num_outputs;
    call_unboxed(Fn, stack, std::index_sequence_for<A...>{});
  }
};

[[noreturn]] inline void value_error(const std::string& msg) { throw std::invalid_argument(msg); }
[[noreturn]] inline void type_error(const std::string& msg) { throw std::runtime_error(kTypeErrorTag + msg); }

// A strong reference to a tensor kept across calls as an int64 (work tables store them): hold()
// takes one, drop() gives it back, held() reads the tensor through it (its current address and size).
inline int64_t hold(const Tensor& t) {
  AtenTensorHandle h = nullptr;
  DSFAST_SHIM(aoti_torch_new_tensor_handle(t.handle(), &h));
  return int64_t(reinterpret_cast<intptr_t>(h));
}
inline void drop(int64_t h) {
  if (h != 0) aoti_torch_delete_tensor_object(reinterpret_cast<AtenTensorHandle>(intptr_t(h)));
}
inline Tensor held(int64_t h) { return Tensor(reinterpret_cast<AtenTensorHandle>(intptr_t(h))); }

// A new uninitialised tensor of `dtype` on CUDA device `index`.
inline OwnedTensor new_cuda_tensor(int32_t index, std::vector<int64_t> sizes, ScalarType dtype) {
  return torch::stable::empty(torch::headeronly::IntHeaderOnlyArrayRef(sizes), dtype, std::nullopt,
                              torch::stable::Device(torch::headeronly::DeviceType::CUDA, index));
}

#define DSFAST_LIBRARY(m) STABLE_TORCH_LIBRARY_FRAGMENT(dsfast, m)
#define DSFAST_LIBRARY_IMPL(key, m) STABLE_TORCH_LIBRARY_IMPL(dsfast, key, m)
#define DSFAST_KERNEL(fn) (&dsfast::op::Boxed<&fn>::call)
#else
using Tensor = at::Tensor;
using ScalarType = c10::ScalarType;
using Tensors = at::TensorList;
template <typename... L>
inline void release_lists(const L&...) {}   // at::TensorList owns nothing
using Flags = const c10::List<bool>&;
using Text = c10::string_view;
using OwnedTensor = at::Tensor;
using OptTensor = const std::optional<at::Tensor>&;
constexpr const char* kAbi = "classic";

[[noreturn]] inline void value_error(const std::string& msg) { TORCH_CHECK_VALUE(false, msg); }
[[noreturn]] inline void type_error(const std::string& msg) { TORCH_CHECK_TYPE(false, msg); }

inline int64_t hold(const Tensor& t) { return int64_t(reinterpret_cast<intptr_t>(new at::Tensor(t))); }
inline void drop(int64_t h) { delete reinterpret_cast<at::Tensor*>(intptr_t(h)); }
inline const at::Tensor& held(int64_t h) { return *reinterpret_cast<const at::Tensor*>(intptr_t(h)); }

inline OwnedTensor new_cuda_tensor(int32_t index, std::vector<int64_t> sizes, ScalarType dtype) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).device(c10::Device(c10::DeviceType::CUDA,
                                                                               c10::DeviceIndex(index))));
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

template <typename T>  // Tensor, or an owning torch::stable::Tensor / at::Tensor
std::string device_name(const T& t) {
  if (t.is_cpu()) return "cpu";
  if (t.is_cuda()) return "cuda:" + std::to_string(int(t.get_device()));
  return "a non-cpu, non-cuda device";
}

template <typename T>
std::string sizes_str(const T& t) {
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
