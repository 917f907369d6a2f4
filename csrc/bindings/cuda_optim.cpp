// Torch operators of dsfast's CUDA kernels (dsfast::cuda_*, csrc/cuda): argument checks with
// messages that name the list and index at fault, dtype mapping, device guard and the current
// stream. All work is queued on torch's current stream; nothing is read back to the host.
// Written against op_abi.h (stable or classic torch ABI); the fake implementations and the
// Python-facing functions are in dsfast/ops/native/cuda_optim.py.
#include <string>
#include <tuple>
#include <vector>

#include "../cuda/dsfast_cuda.h"
#include "op_abi.h"

#if DSFAST_STABLE_ABI
#include <torch/csrc/stable/accelerator.h>
#else
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dc = dsfast::cuda;
using namespace dsfast::op;  // Tensor, Tensors, OptTensor, type_error, ...

namespace {

// Value problems are RuntimeErrors (as torch's own TORCH_CHECK); dtype problems TypeErrors.
[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

// The current device and stream of the call, held for its duration.
struct OnDevice {
#if DSFAST_STABLE_ABI
  explicit OnDevice(int32_t index) : guard(index) {
    void* s = nullptr;
    DSFAST_SHIM(aoti_torch_get_current_cuda_stream(index, &s));
    stream = static_cast<cudaStream_t>(s);
  }
  torch::stable::accelerator::DeviceGuard guard;
#else
  explicit OnDevice(int32_t index)
      : guard(c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(index))),
        stream(c10::cuda::getCurrentCUDAStream(c10::DeviceIndex(index)).stream()) {}
  c10::cuda::CUDAGuard guard;
#endif
  cudaStream_t stream;
};

dc::DType to_dtype(const Tensor& t, const std::string& what) {
  switch (t.scalar_type()) {
    case ScalarType::Float: return dc::DType::kFloat32;
    case ScalarType::Half: return dc::DType::kFloat16;
    case ScalarType::BFloat16: return dc::DType::kBFloat16;
    default: break;
  }
  type_error(what + " has dtype " + dtype_name(t.scalar_type()) + "; the CUDA kernels take float32, float16 or "
             "bfloat16");
}

// The CUDA device a tensor is on, or -1.
template <typename T>
int32_t cuda_index(const T& t) { return t.is_cuda() ? int32_t(t.get_device()) : -1; }

std::string device_str(int32_t cuda) { return cuda < 0 ? "a non-cuda device" : "cuda:" + std::to_string(cuda); }

std::string at_index(const char* op, const char* list, size_t i) {
  return std::string(op) + ": " + list + "[" + std::to_string(i) + "]";
}

// One list of same-dtype, contiguous tensors on CUDA device `device`, matching `numel` when given.
struct ListView {
  std::vector<void*> ptrs;
  dc::DType dtype = dc::DType::kFloat32;
};

ListView view_list(const char* op, const char* name, Tensors ts, int32_t device, const std::vector<int64_t>* numel) {
  ListView v;
  v.ptrs.reserve(ts.size());
  ScalarType first = ScalarType::Float;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    if (!t.defined()) fail(at_index(op, name, i) + " is undefined (None)");
    if (cuda_index(t) != device)
      fail(at_index(op, name, i) + " is on " + device_name(t) + " but the op runs on " + device_str(device) +
           "; every tensor of one call must be on the same CUDA device");
    if (!t.is_contiguous())
      fail(at_index(op, name, i) + " is not contiguous (sizes " + sizes_str(t) +
           "); the kernel works in place on dense memory");
    const dc::DType d = to_dtype(t, at_index(op, name, i));
    if (i == 0) {
      v.dtype = d;
      first = t.scalar_type();
    }
    if (d != v.dtype)
      type_error(at_index(op, name, i) + " has dtype " + dtype_name(t.scalar_type()) + " but " + name + "[0] has " +
                 dtype_name(first) + "; one call takes one dtype per list");
    if (numel != nullptr && (*numel)[i] != t.numel())
      fail(at_index(op, name, i) + " has " + std::to_string(t.numel()) + " elements but its parameter has " +
           std::to_string((*numel)[i]));
    v.ptrs.push_back(t.mutable_data_ptr());
  }
  return v;
}

// The 16-bit model copies written beside fp32 master weights (empty list: none).
ListView view_model_copies(const char* op, Tensors model_copies, Tensors params, dc::DType param_dtype, int32_t dev,
                           const std::vector<int64_t>& numel) {
  ListView mc;
  if (model_copies.empty()) return mc;
  if (param_dtype != dc::DType::kFloat32)
    type_error(std::string(op) + ": with model_copies the params must be float32 master weights, got " +
               dtype_name(params[0].scalar_type()));
  mc = view_list(op, "model_copies", model_copies, dev, &numel);
  if (mc.dtype == dc::DType::kFloat32) type_error(std::string(op) + ": model_copies must be float16 or bfloat16");
  return mc;
}

void check_length(const char* op, const char* name, Tensors ts, size_t n) {
  if (ts.size() != n)
    fail(std::string(op) + ": got " + std::to_string(ts.size()) + " " + name + " for " + std::to_string(n) +
         " params; every list must have one entry per param");
}

template <typename T>  // an optional or a plain owned tensor
const float* device_scalar(const char* op, const char* name, const T& t, int32_t device) {
  if (!t.defined()) return nullptr;
  const std::string what = std::string(op) + ": " + name;
  if (t.numel() != 1) fail(what + " must be a one-element tensor, got shape " + sizes_str(t));
  if (t.scalar_type() != ScalarType::Float) type_error(what + " must be float32, got " + dtype_name(t.scalar_type()));
  if (cuda_index(t) != device)
    fail(what + " is on " + device_name(t) + " but the tensors are on " + device_str(device) +
         " (move it there: no host sync is allowed in the step)");
  return static_cast<const float*>(t.const_data_ptr());
}

const float* device_scalar(const char* op, const char* name, OptTensor t, int32_t device) {
  return t.has_value() ? device_scalar(op, name, *t, device) : nullptr;
}

std::vector<int64_t> numels(Tensors ts) {
  std::vector<int64_t> n(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) n[i] = ts[i].numel();
  return n;
}

int32_t first_device(const char* op, Tensors params) {
  if (params.empty()) fail(std::string(op) + ": empty param list");
  if (!params[0].is_cuda())
    fail(std::string(op) + ": params[0] is on " + device_name(params[0]) +
         "; this op runs on CUDA tensors (use dsfast.ops.reference.portable_multi_tensor for others)");
  return int32_t(params[0].get_device());
}

dc::AmpScalars amp_scalars(const char* op, int32_t d, OptTensor inv_scale, OptTensor clip_coef, OptTensor found_inf) {
  dc::AmpScalars a;
  a.inv_scale = device_scalar(op, "inv_scale", inv_scale, d);
  a.clip_coef = device_scalar(op, "clip_coef", clip_coef, d);
  a.found_inf = device_scalar(op, "found_inf", found_inf, d);
  return a;
}

void adam_(Tensors grads, Tensors params, Tensors exp_avgs, Tensors exp_avg_sqs, Tensors steps, Tensors model_copies,
           double lr, double beta1, double beta2, double eps, double weight_decay, bool adamw, bool bias_correction,
           OptTensor inv_scale, OptTensor clip_coef, OptTensor found_inf, bool maximize) {
  const char* op = "dsfast adam_";
  if (params.empty()) return;
  const int32_t dev = first_device(op, params);
  const size_t n = params.size();
  check_length(op, "grads", grads, n);
  check_length(op, "exp_avgs", exp_avgs, n);
  check_length(op, "exp_avg_sqs", exp_avg_sqs, n);
  check_length(op, "steps", steps, n);
  const bool copy = !model_copies.empty();
  if (copy) check_length(op, "model_copies", model_copies, n);
  const std::vector<int64_t> numel = numels(params);
  ListView p = view_list(op, "params", params, dev, nullptr);
  ListView g = view_list(op, "grads", grads, dev, &numel);
  ListView m = view_list(op, "exp_avgs", exp_avgs, dev, &numel);
  ListView v = view_list(op, "exp_avg_sqs", exp_avg_sqs, dev, &numel);
  if (m.dtype != p.dtype || v.dtype != p.dtype)
    type_error(std::string(op) + ": exp_avgs and exp_avg_sqs must have the params' dtype " +
               dtype_name(params[0].scalar_type()));
  std::vector<float*> step_ptrs(n);
  for (size_t i = 0; i < n; ++i) {
    const Tensor& s = steps[i];
    if (!(s.numel() == 1 && s.scalar_type() == ScalarType::Float && cuda_index(s) == dev))
      fail(at_index(op, "steps", i) + " must be a one-element float32 tensor on " + device_str(dev) +
           " (torch's fused layout), got " + dtype_name(s.scalar_type()) + " of shape " + sizes_str(s) + " on " +
           device_name(s));
    step_ptrs[i] = static_cast<float*>(s.mutable_data_ptr());
  }
  const ListView mc = view_model_copies(op, model_copies, params, p.dtype, dev, numel);
  dc::AdamParams a;
  a.ntensors = (int64_t)n;
  a.numel = numel.data();
  a.grads = g.ptrs.data();
  a.grad_dtype = g.dtype;
  a.params = p.ptrs.data();
  a.param_dtype = p.dtype;
  a.exp_avgs = m.ptrs.data();
  a.exp_avg_sqs = v.ptrs.data();
  a.steps = step_ptrs.data();
  a.model_copies = copy ? mc.ptrs.data() : nullptr;
  a.model_dtype = mc.dtype;
  a.lr = lr;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.eps = eps;
  a.weight_decay = weight_decay;
  a.adamw = adamw;
  a.bias_correction = bias_correction;
  a.maximize = maximize;
  a.amp = amp_scalars(op, dev, inv_scale, clip_coef, found_inf);
  const OnDevice on(dev);
  dc::adam(a, on.stream);
}

void sgd_(Tensors grads, Tensors params, Tensors momentum_buffers, Tensors model_copies, double lr, double momentum,
          double dampening, double weight_decay, bool nesterov, bool first_step, OptTensor inv_scale,
          OptTensor clip_coef, OptTensor found_inf, bool maximize) {
  const char* op = "dsfast sgd_";
  if (params.empty()) return;
  const int32_t dev = first_device(op, params);
  const size_t n = params.size();
  check_length(op, "grads", grads, n);
  const bool has_buf = momentum != 0.0;
  if (!has_buf && !momentum_buffers.empty()) fail(std::string(op) + ": momentum is 0 but momentum_buffers were given");
  if (has_buf) check_length(op, "momentum_buffers", momentum_buffers, n);
  const bool copy = !model_copies.empty();
  if (copy) check_length(op, "model_copies", model_copies, n);
  const std::vector<int64_t> numel = numels(params);
  ListView p = view_list(op, "params", params, dev, nullptr);
  ListView g = view_list(op, "grads", grads, dev, &numel);
  ListView b;
  if (has_buf) {
    b = view_list(op, "momentum_buffers", momentum_buffers, dev, &numel);
    if (b.dtype != p.dtype)
      type_error(std::string(op) + ": momentum_buffers must have the params' dtype " +
                 dtype_name(params[0].scalar_type()));
  }
  const ListView mc = view_model_copies(op, model_copies, params, p.dtype, dev, numel);
  dc::SGDParams a;
  a.ntensors = (int64_t)n;
  a.numel = numel.data();
  a.grads = g.ptrs.data();
  a.grad_dtype = g.dtype;
  a.params = p.ptrs.data();
  a.param_dtype = p.dtype;
  a.momentum_buffers = has_buf ? b.ptrs.data() : nullptr;
  a.model_copies = copy ? mc.ptrs.data() : nullptr;
  a.model_dtype = mc.dtype;
  a.lr = lr;
  a.momentum = momentum;
  a.dampening = dampening;
  a.weight_decay = weight_decay;
  a.nesterov = nesterov;
  a.first_step = first_step;
  a.maximize = maximize;
  a.amp = amp_scalars(op, dev, inv_scale, clip_coef, found_inf);
  const OnDevice on(dev);
  dc::sgd(a, on.stream);
}

void unscale_and_check_(Tensors grads, const OwnedTensor& inv_scale, const OwnedTensor& found_inf) {
  const char* op = "dsfast unscale_and_check_";
  if (grads.empty()) return;
  const int32_t dev = first_device(op, grads);
  ListView g = view_list(op, "grads", grads, dev, nullptr);
  const std::vector<int64_t> numel = numels(grads);
  dc::UnscaleParams a;
  a.ntensors = (int64_t)grads.size();
  a.numel = numel.data();
  a.grads = g.ptrs.data();
  a.dtype = g.dtype;
  a.inv_scale = device_scalar(op, "inv_scale", inv_scale, dev);
  a.found_inf = const_cast<float*>(device_scalar(op, "found_inf", found_inf, dev));
  if (a.inv_scale == nullptr || a.found_inf == nullptr) fail(std::string(op) + ": inv_scale and found_inf are required");
  const OnDevice on(dev);
  dc::unscale_and_check(a, on.stream);
}

// Returns (total, per_tensor or an empty tensor, clip_coef or an empty tensor).
std::tuple<OwnedTensor, OwnedTensor, OwnedTensor> l2_norm(Tensors tensors, bool per_tensor, OptTensor inv_scale,
                                                         OptTensor found_inf, double max_norm) {
  const char* op = "dsfast l2_norm";
  const int32_t dev = first_device(op, tensors);
  ListView t = view_list(op, "tensors", tensors, dev, nullptr);
  const std::vector<int64_t> numel = numels(tensors);
  OwnedTensor total = new_cuda_tensor(dev, {}, ScalarType::Float);
  OwnedTensor per = new_cuda_tensor(dev, {per_tensor ? (int64_t)tensors.size() : 0}, ScalarType::Float);
  OwnedTensor clip = new_cuda_tensor(dev, max_norm > 0.0 ? std::vector<int64_t>{} : std::vector<int64_t>{0},
                                     ScalarType::Float);
  const size_t bytes = dc::l2_norm_workspace_bytes((int64_t)tensors.size(), numel.data());
  OwnedTensor ws = new_cuda_tensor(dev, {(int64_t)bytes}, ScalarType::Byte);
  dc::L2NormParams a;
  a.ntensors = (int64_t)tensors.size();
  a.numel = numel.data();
  a.tensors = t.ptrs.data();
  a.dtype = t.dtype;
  a.workspace = ws.mutable_data_ptr();
  a.total = static_cast<float*>(total.mutable_data_ptr());
  a.per_tensor = per_tensor ? static_cast<float*>(per.mutable_data_ptr()) : nullptr;
  a.inv_scale = device_scalar(op, "inv_scale", inv_scale, dev);
  a.found_inf = const_cast<float*>(device_scalar(op, "found_inf", found_inf, dev));
  a.clip_coef = max_norm > 0.0 ? static_cast<float*>(clip.mutable_data_ptr()) : nullptr;
  a.max_norm = (float)max_norm;
  const OnDevice on(dev);
  dc::l2_norm(a, on.stream);
  return {total, per, clip};
}

}  // namespace

DSFAST_LIBRARY(m) {
  m.def("cuda_adam_(Tensor[] grads, Tensor(a!)[] params, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "Tensor[] steps, Tensor(d!)[] model_copies, float lr, float beta1, float beta2, float eps, "
        "float weight_decay, bool adamw, bool bias_correction, Tensor? inv_scale=None, Tensor? clip_coef=None, "
        "Tensor? found_inf=None, bool maximize=False) -> ()");
  m.def("cuda_sgd_(Tensor[] grads, Tensor(a!)[] params, Tensor(b!)[] momentum_buffers, Tensor(c!)[] model_copies, "
        "float lr, float momentum, float dampening, float weight_decay, bool nesterov, bool first_step, "
        "Tensor? inv_scale=None, Tensor? clip_coef=None, Tensor? found_inf=None, bool maximize=False) -> ()");
  m.def("cuda_unscale_and_check_(Tensor(a!)[] grads, Tensor inv_scale, Tensor(b!) found_inf) -> ()");
  m.def("cuda_l2_norm(Tensor[] tensors, bool per_tensor=False, Tensor? inv_scale=None, Tensor(a!)? found_inf=None, "
        "float max_norm=0.0) -> (Tensor, Tensor, Tensor)");
}

DSFAST_LIBRARY_IMPL(CUDA, m) {
  m.impl("cuda_adam_", DSFAST_KERNEL(adam_));
  m.impl("cuda_sgd_", DSFAST_KERNEL(sgd_));
  m.impl("cuda_unscale_and_check_", DSFAST_KERNEL(unscale_and_check_));
  m.impl("cuda_l2_norm", DSFAST_KERNEL(l2_norm));
}
