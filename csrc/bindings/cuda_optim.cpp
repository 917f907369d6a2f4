// Torch glue for dsfast's CUDA kernels (csrc/cuda): argument checks with messages that name
// the list and index at fault, dtype mapping, device guard and the current stream.
// All work is queued on torch's current stream; nothing is read back to the host.
//
// Headers: only what this file uses (torch/extension.h would add the nn/optim/autograd
// API, several seconds of parsing per build): the Tensor class, at::empty, torch's pybind
// casters for tensors and the CUDA guard/stream.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <string>
#include <vector>

#include "../cuda/dsfast_cuda.h"

namespace dc = dsfast::cuda;
using at::Tensor;
using at::TensorList;
using TensorVec = std::vector<Tensor>;

namespace {

dc::DType to_dtype(const Tensor& t, const std::string& what) {
  switch (t.scalar_type()) {
    case at::kFloat: return dc::DType::kFloat32;
    case at::kHalf: return dc::DType::kFloat16;
    case at::kBFloat16: return dc::DType::kBFloat16;
    default: break;
  }
  TORCH_CHECK_TYPE(false, what, " has dtype ", t.scalar_type(),
                   "; the CUDA kernels take float32, float16 or bfloat16");
}

std::string at_index(const char* op, const char* list, size_t i) {
  return std::string(op) + ": " + list + "[" + std::to_string(i) + "]";
}

// One list of same-dtype, contiguous tensors on `device`, matching `numel` when given.
struct ListView {
  std::vector<void*> ptrs;
  dc::DType dtype = dc::DType::kFloat32;
};

ListView view_list(const char* op, const char* name, TensorList ts, const at::Device& device,
                   const std::vector<int64_t>* numel) {
  ListView v;
  v.ptrs.reserve(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    const std::string where = at_index(op, name, i);
    TORCH_CHECK(t.defined(), where, " is undefined (None)");
    TORCH_CHECK(t.device() == device, where, " is on ", t.device(), " but the op runs on ", device,
                "; every tensor of one call must be on the same CUDA device");
    TORCH_CHECK(t.is_contiguous(), where, " is not contiguous (sizes ", t.sizes(), ", strides ",
                t.strides(), "); the kernel works in place on dense memory");
    const dc::DType d = to_dtype(t, where);
    if (i == 0) v.dtype = d;
    TORCH_CHECK_TYPE(d == v.dtype, where, " has dtype ", t.scalar_type(), " but ", name,
                     "[0] has ", ts[0].scalar_type(), "; one call takes one dtype per list");
    if (numel != nullptr)
      TORCH_CHECK((*numel)[i] == t.numel(), where, " has ", t.numel(), " elements but its parameter has ",
                  (*numel)[i]);
    v.ptrs.push_back(t.data_ptr());
  }
  return v;
}

// The 16-bit model copies written beside fp32 master weights (empty list: none).
ListView view_model_copies(const char* op, TensorList model_copies, TensorList params, dc::DType param_dtype,
                           const at::Device& dev, const std::vector<int64_t>& numel) {
  ListView mc;
  if (model_copies.empty()) return mc;
  TORCH_CHECK_TYPE(param_dtype == dc::DType::kFloat32, op, ": with model_copies the params must be float32 "
                   "master weights, got ", params[0].scalar_type());
  mc = view_list(op, "model_copies", model_copies, dev, &numel);
  TORCH_CHECK_TYPE(mc.dtype != dc::DType::kFloat32, op, ": model_copies must be float16 or bfloat16");
  return mc;
}

void check_length(const char* op, const char* name, TensorList ts, size_t n) {
  TORCH_CHECK(ts.size() == n, op, ": got ", ts.size(), " ", name, " for ", n,
              " params; every list must have one entry per param");
}

const float* device_scalar(const char* op, const char* name, const c10::optional<Tensor>& t,
                           const at::Device& device) {
  if (!t.has_value() || !t->defined()) return nullptr;
  TORCH_CHECK(t->numel() == 1, op, ": ", name, " must be a one-element tensor, got shape ", t->sizes());
  TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", t->scalar_type());
  TORCH_CHECK(t->device() == device, op, ": ", name, " is on ", t->device(), " but the tensors are on ", device,
              " (move it there: no host sync is allowed in the step)");
  return t->data_ptr<float>();
}

std::vector<int64_t> numels(TensorList ts) {
  std::vector<int64_t> n(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) n[i] = ts[i].numel();
  return n;
}

at::Device first_device(const char* op, TensorList params) {
  TORCH_CHECK(!params.empty(), op, ": empty param list");
  TORCH_CHECK(params[0].is_cuda(), op, ": params[0] is on ", params[0].device(),
              "; this op runs on CUDA tensors (use dsfast.ops.reference.cuda_optim for others)");
  return params[0].device();
}

dc::AmpScalars amp_scalars(const char* op, const at::Device& d, const c10::optional<Tensor>& inv_scale,
                           const c10::optional<Tensor>& clip_coef, const c10::optional<Tensor>& found_inf) {
  dc::AmpScalars a;
  a.inv_scale = device_scalar(op, "inv_scale", inv_scale, d);
  a.clip_coef = device_scalar(op, "clip_coef", clip_coef, d);
  a.found_inf = device_scalar(op, "found_inf", found_inf, d);
  return a;
}

void adam_(const TensorVec& grads, const TensorVec& params, const TensorVec& exp_avgs,
           const TensorVec& exp_avg_sqs, const TensorVec& steps, const TensorVec& model_copies, double lr,
           double beta1, double beta2, double eps,
           double weight_decay, bool adamw, bool bias_correction, c10::optional<Tensor> inv_scale,
           c10::optional<Tensor> clip_coef, c10::optional<Tensor> found_inf, bool maximize) {
  const char* op = "dsfast adam_";
  if (params.empty()) return;
  const at::Device dev = first_device(op, params);
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
  TORCH_CHECK_TYPE(m.dtype == p.dtype && v.dtype == p.dtype, op,
                   ": exp_avgs and exp_avg_sqs must have the params' dtype ", params[0].scalar_type());
  std::vector<float*> step_ptrs(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string where = at_index(op, "steps", i);
    TORCH_CHECK(steps[i].numel() == 1 && steps[i].scalar_type() == at::kFloat && steps[i].device() == dev,
                where, " must be a one-element float32 tensor on ", dev, " (torch's fused layout), got ",
                steps[i].scalar_type(), " of shape ", steps[i].sizes(), " on ", steps[i].device());
    step_ptrs[i] = steps[i].data_ptr<float>();
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
  const c10::cuda::CUDAGuard guard(dev);
  dc::adam(a, c10::cuda::getCurrentCUDAStream(dev.index()).stream());
}

void sgd_(const TensorVec& grads, const TensorVec& params, const TensorVec& momentum_buffers,
          const TensorVec& model_copies,
          double lr, double momentum, double dampening, double weight_decay, bool nesterov, bool first_step,
          c10::optional<Tensor> inv_scale, c10::optional<Tensor> clip_coef, c10::optional<Tensor> found_inf,
          bool maximize) {
  const char* op = "dsfast sgd_";
  if (params.empty()) return;
  const at::Device dev = first_device(op, params);
  const size_t n = params.size();
  check_length(op, "grads", grads, n);
  const bool has_buf = momentum != 0.0;
  TORCH_CHECK(has_buf || momentum_buffers.empty(), op, ": momentum is 0 but momentum_buffers were given");
  if (has_buf) check_length(op, "momentum_buffers", momentum_buffers, n);
  const bool copy = !model_copies.empty();
  if (copy) check_length(op, "model_copies", model_copies, n);
  const std::vector<int64_t> numel = numels(params);
  ListView p = view_list(op, "params", params, dev, nullptr);
  ListView g = view_list(op, "grads", grads, dev, &numel);
  ListView b;
  if (has_buf) {
    b = view_list(op, "momentum_buffers", momentum_buffers, dev, &numel);
    TORCH_CHECK_TYPE(b.dtype == p.dtype, op, ": momentum_buffers must have the params' dtype ",
                     params[0].scalar_type());
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
  const c10::cuda::CUDAGuard guard(dev);
  dc::sgd(a, c10::cuda::getCurrentCUDAStream(dev.index()).stream());
}

void unscale_and_check_(const TensorVec& grads, Tensor inv_scale, Tensor found_inf) {
  const char* op = "dsfast unscale_and_check_";
  if (grads.empty()) return;
  const at::Device dev = first_device(op, grads);
  ListView g = view_list(op, "grads", grads, dev, nullptr);
  const std::vector<int64_t> numel = numels(grads);
  dc::UnscaleParams a;
  a.ntensors = (int64_t)grads.size();
  a.numel = numel.data();
  a.grads = g.ptrs.data();
  a.dtype = g.dtype;
  a.inv_scale = device_scalar(op, "inv_scale", inv_scale, dev);
  a.found_inf = const_cast<float*>(device_scalar(op, "found_inf", found_inf, dev));
  const c10::cuda::CUDAGuard guard(dev);
  dc::unscale_and_check(a, c10::cuda::getCurrentCUDAStream(dev.index()).stream());
}

// Returns (total, per_tensor or an empty tensor, clip_coef or an empty tensor).
std::tuple<Tensor, Tensor, Tensor> l2_norm(const TensorVec& tensors, bool per_tensor, c10::optional<Tensor> inv_scale,
                                           c10::optional<Tensor> found_inf, double max_norm) {
  const char* op = "dsfast l2_norm";
  const at::Device dev = first_device(op, tensors);
  ListView t = view_list(op, "tensors", tensors, dev, nullptr);
  const std::vector<int64_t> numel = numels(tensors);
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(dev);
  Tensor total = at::empty({}, fopts);
  Tensor per = per_tensor ? at::empty({(int64_t)tensors.size()}, fopts) : at::empty({0}, fopts);
  Tensor clip = max_norm > 0.0 ? at::empty({}, fopts) : at::empty({0}, fopts);
  const size_t bytes = dc::l2_norm_workspace_bytes((int64_t)tensors.size(), numel.data());
  Tensor ws = at::empty({(int64_t)bytes}, at::TensorOptions().dtype(at::kByte).device(dev));
  dc::L2NormParams a;
  a.ntensors = (int64_t)tensors.size();
  a.numel = numel.data();
  a.tensors = t.ptrs.data();
  a.dtype = t.dtype;
  a.workspace = ws.data_ptr();
  a.total = total.data_ptr<float>();
  a.per_tensor = per_tensor ? per.data_ptr<float>() : nullptr;
  a.inv_scale = device_scalar(op, "inv_scale", inv_scale, dev);
  a.found_inf = const_cast<float*>(device_scalar(op, "found_inf", found_inf, dev));
  a.clip_coef = max_norm > 0.0 ? clip.data_ptr<float>() : nullptr;
  a.max_norm = (float)max_norm;
  const c10::cuda::CUDAGuard guard(dev);
  dc::l2_norm(a, c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  return {total, per, clip};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "dsfast CUDA multi-tensor kernels (see dsfast.ops.reference.cuda_optim for the semantics)";
  m.def("adam_", &adam_, "Adam/AdamW over tensor lists", py::arg("grads"), py::arg("params"),
        py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("steps"), py::arg("model_copies"), py::arg("lr"),
        py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("adamw"),
        py::arg("bias_correction"), py::arg("inv_scale") = py::none(), py::arg("clip_coef") = py::none(),
        py::arg("found_inf") = py::none(), py::arg("maximize") = false);
  m.def("sgd_", &sgd_, "SGD over tensor lists", py::arg("grads"), py::arg("params"),
        py::arg("momentum_buffers"), py::arg("model_copies"), py::arg("lr"), py::arg("momentum"),
        py::arg("dampening"), py::arg("weight_decay"), py::arg("nesterov"), py::arg("first_step"),
        py::arg("inv_scale") = py::none(), py::arg("clip_coef") = py::none(), py::arg("found_inf") = py::none(),
        py::arg("maximize") = false);
  m.def("unscale_and_check_", &unscale_and_check_, "grads *= inv_scale; found_inf = 1 on inf/nan",
        py::arg("grads"), py::arg("inv_scale"), py::arg("found_inf"));
  m.def("l2_norm", &l2_norm, "L2 norms: (total, per_tensor, clip_coef)", py::arg("tensors"),
        py::arg("per_tensor") = false, py::arg("inv_scale") = py::none(), py::arg("found_inf") = py::none(),
        py::arg("max_norm") = 0.0);
}
