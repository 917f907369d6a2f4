// Torch binding of the CPU optimizer kernels: argument checks and dtype mapping only.
// The kernels (csrc/cpu) never see a torch header. Errors are ValueError/TypeError
// naming the tensor ("<label>[i]") and what would be valid.
//
// Compile time: this file is the critical path of the op's cold build, so it includes
// only at::TensorBase and pybind11 (~3 s of parsing). torch/python.h costs ~11 s and
// torch/csrc/autograd/python_variable.h (torch's accessor for the tensor inside a Python
// object) ~8 s: it pulls in autograd, the JIT's schema types and all of torch's pybind
// casters. The two things taken from it are done here instead: see tensor_of().
#include <ATen/core/TensorBase.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../cpu/cpu_optim.h"

namespace py = pybind11;
using dsfast::cpu::DType;

// torch.Tensor and torch.nn.Parameter, exported by libtorch_python (declared in
// python_variable.h with these exact names since torch 1.x).
extern PyObject* THPVariableClass;
extern PyObject* ParameterClass;

namespace {

// Byte offset of the at::Tensor inside torch's Python tensor object (THPVariable). Its
// layout is private and has changed between releases (an at::Tensor right after the
// object header in recent ones, a c10::MaybeOwned<at::Tensor> earlier), but in every one
// the tensor is a single TensorImpl pointer stored at a fixed offset. It is found once at
// import: the word equal to the TensorImpl address that `tensor._cdata` reports, agreed
// on by a plain tensor and a Parameter. No match means an unknown layout: the import
// fails with a clear error instead of reading the wrong memory later.
size_t g_tensor_offset = 0;

void find_tensor_offset() {
  py::module_ torch = py::module_::import("torch");
  py::object plain = torch.attr("empty")(3);
  py::object param = torch.attr("nn").attr("Parameter")(torch.attr("empty")(5));
  size_t found = 0;
  for (size_t off = sizeof(PyObject); off <= sizeof(PyObject) + 4 * sizeof(void*); off += sizeof(void*)) {
    auto word = [off](const py::object& o) {
      uintptr_t w;
      std::memcpy(&w, reinterpret_cast<const char*>(o.ptr()) + off, sizeof(w));
      return w;
    };
    if (word(plain) == plain.attr("_cdata").cast<uintptr_t>() &&
        word(param) == param.attr("_cdata").cast<uintptr_t>()) {
      found = off;
      break;
    }
  }
  if (found == 0)
    throw py::import_error("dsfast cpu_optim: cannot find the tensor inside a Python tensor object of torch " +
                           torch.attr("__version__").cast<std::string>() +
                           " (unknown layout); the compiled binding does not support this torch version");
  g_tensor_offset = found;
}

// THPVariable_Check: torch.Tensor or a subclass (fast path for exact Tensor/Parameter).
bool is_tensor(PyObject* obj) {
  if (!THPVariableClass) return false;
  if (Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(THPVariableClass) ||
      Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(ParameterClass))
    return true;
  const int r = PyObject_IsInstance(obj, THPVariableClass);
  if (r == -1) throw py::error_already_set();
  return r != 0;
}

// THPVariable_Unpack: the tensor held by a Python tensor object, read in place (no copy).
const at::TensorBase& tensor_of(PyObject* obj) {
  return *reinterpret_cast<const at::TensorBase*>(reinterpret_cast<const char*>(obj) + g_tensor_offset);
}

// Names tensor i in error messages. Built only when an error is raised: a step over
// thousands of tensors must not allocate a string per tensor.
struct Where {
  const std::string& label;
  size_t i;
  operator std::string() const { return label + "[" + std::to_string(i) + "]"; }
};
std::string operator+(const Where& w, const char* s) { return std::string(w) + s; }

// A Python list/tuple of tensors read in place. pybind's list caster copies every
// at::Tensor (a refcount increment and decrement each): ~0.3 ms of a 2000-tensor step.
class Tensors {
 public:
  Tensors(const py::handle& seq, const char* name, bool allow_none = false) {
    const std::string msg = std::string(name) + " must be a list or tuple of tensors";
    seq_ = py::reinterpret_steal<py::object>(PySequence_Fast(seq.ptr(), msg.c_str()));
    if (!seq_) throw py::error_already_set();
    n_ = size_t(PySequence_Fast_GET_SIZE(seq_.ptr()));
    items_ = PySequence_Fast_ITEMS(seq_.ptr());
    for (size_t i = 0; i < n_; ++i) {
      if (allow_none && items_[i] == Py_None) continue;
      if (!is_tensor(items_[i]))
        throw py::type_error(std::string(name) + "[" + std::to_string(i) + "] is a " + Py_TYPE(items_[i])->tp_name +
                             ", not a tensor");
    }
  }
  size_t size() const { return n_; }
  bool none(size_t i) const { return items_[i] == Py_None; }
  const at::TensorBase& operator[](size_t i) const { return tensor_of(items_[i]); }

 private:
  py::object seq_;
  PyObject** items_ = nullptr;
  size_t n_ = 0;
};

DType grad_dtype(const at::TensorBase& g, const Where& w) {
  switch (g.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::F16;
    default:
      throw py::type_error(w + ".grad has dtype " + std::string(c10::toString(g.scalar_type())) +
                           "; supported gradient dtypes are float32, bfloat16, float16");
  }
}

void check_fp32(const at::TensorBase& t, const at::TensorBase& p, const Where& w, const char* what) {
  if (!t.defined()) throw py::value_error(w + " " + what + " is missing");
  if (t.device().type() != at::kCPU) throw py::value_error(w + " " + what + " is on " + t.device().str() + ", not cpu");
  if (t.scalar_type() != at::kFloat)
    throw py::type_error(w + " " + what + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                         "; it must be float32");
  if (!t.is_contiguous())
    throw py::value_error(w + " " + what + " is not contiguous; updating a contiguous copy would lose the update");
  if (t.numel() != p.numel())
    throw py::value_error(w + " " + what + " has " + std::to_string(t.numel()) + " elements but the parameter has " +
                          std::to_string(p.numel()));
}

void check_param(const at::TensorBase& p, const Where& w) {
  if (!p.defined()) throw py::value_error(w + " is undefined");
  if (p.device().type() != at::kCPU)
    throw py::value_error(w + " is on device " + p.device().str() + "; CPU optimizers update cpu tensors only");
  if (p.scalar_type() != at::kFloat)
    throw py::type_error(w + " has dtype " + std::string(c10::toString(p.scalar_type())) +
                         "; CPU optimizers keep fp32 parameters");
  if (!p.is_contiguous())
    throw py::value_error(w + " is not contiguous; updating a contiguous copy would silently lose the update");
}

DType check_grad(const at::TensorBase& g, const at::TensorBase& p, const Where& w) {
  if (!g.defined()) throw py::value_error(w + ".grad is missing");
  if (g.device().type() != at::kCPU) throw py::value_error(w + ".grad is on " + g.device().str() + ", not cpu");
  DType d = grad_dtype(g, w);
  if (g.sizes() != p.sizes())
    throw py::value_error(w + ".grad has shape " + c10::str(g.sizes()) + " but the parameter has shape " +
                          c10::str(p.sizes()));
  if (!g.is_contiguous()) throw py::value_error(w + ".grad is not contiguous; the kernel reads gradients in place");
  return d;
}

DType check_out(const Tensors& outs, size_t i, const at::TensorBase& p, const Where& w, void** ptr) {
  *ptr = nullptr;
  if (outs.size() == 0 || outs.none(i)) return DType::None;
  const at::TensorBase& o = outs[i];
  if (o.device().type() != at::kCPU) throw py::value_error(w + " 16-bit output is on " + o.device().str());
  DType d;
  if (o.scalar_type() == at::kBFloat16) d = DType::BF16;
  else if (o.scalar_type() == at::kHalf) d = DType::F16;
  else
    throw py::type_error(w + " 16-bit output has dtype " + std::string(c10::toString(o.scalar_type())) +
                         "; it must be bfloat16 or float16");
  if (o.numel() != p.numel() || !o.is_contiguous())
    throw py::value_error(w + " 16-bit output must be contiguous with " + std::to_string(p.numel()) +
                          " elements, got " + std::to_string(o.numel()));
  *ptr = o.data_ptr();
  return d;
}

void check_lengths(size_t n, std::initializer_list<std::pair<const char*, size_t>> others, bool outs_empty_ok,
                   size_t outs) {
  for (auto& [name, len] : others)
    if (len != n)
      throw py::value_error(std::string(name) + " has " + std::to_string(len) + " entries but there are " +
                            std::to_string(n) + " params");
  if (!(outs_empty_ok && outs == 0) && outs != n)
    throw py::value_error("outs has " + std::to_string(outs) + " entries; pass [] or one per param (" +
                          std::to_string(n) + ")");
}

float* step_counter(const at::TensorBase& s, const Where& w) {
  if (!s.defined() || s.device().type() != at::kCPU || s.scalar_type() != at::kFloat || s.numel() != 1)
    throw py::value_error(w + " step must be a one-element float32 cpu tensor (torch's layout)");
  return s.data_ptr<float>();
}

dsfast::cpu::Isa isa_arg(const std::string& isa) {
  try {
    return dsfast::cpu::parse_isa(isa.c_str());
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
}

// One call = one parallel region over every tensor. Each step tensor is incremented
// here (torch increments before computing the bias corrections).
void adam_step(py::handle params_, py::handle grads_, py::handle exp_avgs_, py::handle exp_avg_sqs_,
               py::handle outs_, py::handle steps_, double lr, double beta1, double beta2, double eps,
               double weight_decay, bool adamw, bool bias_correction, double grad_scale, int64_t num_threads,
               const std::string& isa, const std::string& label) {
  const Tensors params(params_, "params"), grads(grads_, "grads"), exp_avgs(exp_avgs_, "exp_avgs"),
      exp_avg_sqs(exp_avg_sqs_, "exp_avg_sqs"), outs(outs_, "outs", true), steps(steps_, "steps");
  const size_t n = params.size();
  check_lengths(n, {{"grads", grads.size()}, {"exp_avgs", exp_avgs.size()}, {"exp_avg_sqs", exp_avg_sqs.size()},
                    {"steps", steps.size()}}, true, outs.size());
  const auto isa_v = isa_arg(isa);
  std::vector<dsfast::cpu::AdamTensor> work(n);
  std::vector<float*> counters(n);
  int64_t last_step = -1;
  dsfast::AdamCoeffs c{};
  for (size_t i = 0; i < n; ++i) {
    const Where w{label, i};
    check_param(params[i], w);
    DType gd = check_grad(grads[i], params[i], w);
    check_fp32(exp_avgs[i], params[i], w, "state['exp_avg']");
    check_fp32(exp_avg_sqs[i], params[i], w, "state['exp_avg_sq']");
    void* out = nullptr;
    DType od = check_out(outs, i, params[i], w, &out);
    counters[i] = step_counter(steps[i], w);
    const int64_t step = int64_t(*counters[i]) + 1;
    if (step != last_step) {  // bias corrections: once per distinct step count, not per tensor
      last_step = step;
      c = dsfast::make_adam_coeffs(lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, step);
      c.grad_scale = float(grad_scale);
    }
    work[i] = {params[i].data_ptr<float>(), grads[i].data_ptr(), exp_avgs[i].data_ptr<float>(),
               exp_avg_sqs[i].data_ptr<float>(), out, params[i].numel(), gd, od, c};
  }
  {
    py::gil_scoped_release nogil;
    dsfast::cpu::adam_step(work.data(), int64_t(n), int(num_threads), isa_v);
  }
  for (float* s : counters) *s += 1.0f;
}

void sgd_step(py::handle params_, py::handle grads_, py::handle momentum_buffers_, py::handle outs_,
              const std::vector<bool>& first_steps, double lr, double momentum, double dampening,
              double weight_decay, bool nesterov, double grad_scale, int64_t num_threads, const std::string& isa,
              const std::string& label) {
  const Tensors params(params_, "params"), grads(grads_, "grads"), outs(outs_, "outs", true),
      momentum_buffers(momentum_buffers_, "momentum_buffers");
  const size_t n = params.size();
  const bool mom = momentum != 0.0;
  check_lengths(n, {{"grads", grads.size()}}, true, outs.size());
  if (mom) check_lengths(n, {{"momentum_buffers", momentum_buffers.size()}, {"first_steps", first_steps.size()}},
                         true, 0);
  const auto isa_v = isa_arg(isa);
  std::vector<dsfast::cpu::SGDTensor> work(n);
  for (size_t i = 0; i < n; ++i) {
    const Where w{label, i};
    check_param(params[i], w);
    DType gd = check_grad(grads[i], params[i], w);
    float* buf = nullptr;
    if (mom) {
      check_fp32(momentum_buffers[i], params[i], w, "state['momentum_buffer']");
      buf = momentum_buffers[i].data_ptr<float>();
    }
    void* out = nullptr;
    DType od = check_out(outs, i, params[i], w, &out);
    auto c = dsfast::make_sgd_coeffs(lr, momentum, dampening, weight_decay, nesterov,
                                     mom && first_steps[i]);
    c.grad_scale = float(grad_scale);
    work[i] = {params[i].data_ptr<float>(), grads[i].data_ptr(), buf, out, params[i].numel(), gd, od, c};
  }
  py::gil_scoped_release nogil;
  dsfast::cpu::sgd_step(work.data(), int64_t(n), int(num_threads), isa_v);
}

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (auto i : {dsfast::cpu::Isa::AVX512, dsfast::cpu::Isa::AVX2, dsfast::cpu::Isa::Scalar})
    if (dsfast::cpu::isa_supported(i)) out.push_back(dsfast::cpu::isa_name(i));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  find_tensor_offset();
  m.doc() = "dsfast CPU optimizer kernels (Adam/AdamW/SGD; AVX-512/AVX2/scalar chosen at run time)";
  m.def("adam_step", &adam_step, "Adam/AdamW over a list of fp32 tensors (one parallel region)",
        py::arg("params"), py::arg("grads"), py::arg("exp_avgs"), py::arg("exp_avg_sqs"), py::arg("outs"),
        py::arg("steps"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"),
        py::arg("weight_decay"), py::arg("adamw"), py::arg("bias_correction"), py::arg("grad_scale") = 1.0,
        py::arg("num_threads") = 0, py::arg("isa") = "auto", py::arg("label") = "params");
  m.def("sgd_step", &sgd_step, "SGD (momentum, dampening, nesterov, weight decay) over a list of fp32 tensors",
        py::arg("params"), py::arg("grads"), py::arg("momentum_buffers"), py::arg("outs"), py::arg("first_steps"),
        py::arg("lr"), py::arg("momentum"), py::arg("dampening"), py::arg("weight_decay"), py::arg("nesterov"),
        py::arg("grad_scale") = 1.0, py::arg("num_threads") = 0, py::arg("isa") = "auto",
        py::arg("label") = "params");
  m.def("available_isas", &available_isas, "instruction sets this CPU can run, best first");
  m.def("best_isa", [] { return std::string(dsfast::cpu::isa_name(dsfast::cpu::best_isa())); });
  m.def("openmp_enabled", &dsfast::cpu::openmp_enabled);
}
