// Torch binding of the CPU optimizer kernels: argument checks and dtype mapping only.
// The kernels (csrc/cpu) never see a torch header. Errors are ValueError/TypeError
// naming the tensor ("<label>[i]") and what would be valid.
//
// Compile time: this file is the critical path of the op's cold build, so it includes
// only Python.h and at::TensorBase (~1.5 s of parsing). torch/python.h costs ~11 s,
// torch/csrc/autograd/python_variable.h (torch's accessor for the tensor inside a Python
// object) ~8 s, and even a one-function pybind11 module ~5.5 s at -O3. So the module is
// written against the CPython API (METH_FASTCALL; argument parsing in py_call.h), and the
// two things taken from python_variable.h are done here: see is_tensor() and tensor_of().
#include <Python.h>

#include <ATen/core/TensorBase.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "../cpu/cpu_optim.h"
#include "py_call.h"

using dsfast::cpu::DType;
using namespace dsfast::py_call;  // Args, Ref, NoGil, PyError, type_error, value_error

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

uintptr_t word_at(PyObject* o, size_t off) {
  uintptr_t w;
  std::memcpy(&w, reinterpret_cast<const char*>(o) + off, sizeof(w));
  return w;
}

uintptr_t cdata(PyObject* t) {
  Ref v(PyObject_GetAttrString(t, "_cdata"));
  const uintptr_t a = uintptr_t(PyLong_AsVoidPtr(v.ok()));
  if (PyErr_Occurred()) throw PyErrorAlreadySet{};
  return a;
}

void find_tensor_offset() {
  Ref torch(PyImport_ImportModule("torch"));
  Ref plain(PyObject_CallMethod(torch.ok(), "empty", "i", 3));
  Ref nn(PyObject_GetAttrString(torch.ok(), "nn"));
  Ref raw(PyObject_CallMethod(torch.ok(), "empty", "i", 5));
  Ref param(PyObject_CallMethod(nn.ok(), "Parameter", "O", raw.ok()));
  const uintptr_t plain_impl = cdata(plain.ok()), param_impl = cdata(param.ok());
  for (size_t off = sizeof(PyObject); off <= sizeof(PyObject) + 4 * sizeof(void*); off += sizeof(void*)) {
    if (word_at(plain.get(), off) == plain_impl && word_at(param.get(), off) == param_impl) {
      g_tensor_offset = off;
      return;
    }
  }
  Ref version(PyObject_GetAttrString(torch.ok(), "__version__"));
  const char* v = version.get() && PyUnicode_Check(version.get()) ? PyUnicode_AsUTF8(version.get()) : "?";
  throw PyError{PyExc_ImportError, std::string("dsfast cpu_optim: cannot find the tensor inside a Python tensor "
                                               "object of torch ") + (v ? v : "?") +
                                       " (unknown layout); the compiled binding does not support this torch version"};
}

// THPVariable_Check: torch.Tensor or a subclass (fast path for exact Tensor/Parameter).
bool is_tensor(PyObject* obj) {
  if (!THPVariableClass) return false;
  if (Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(THPVariableClass) ||
      Py_TYPE(obj) == reinterpret_cast<PyTypeObject*>(ParameterClass))
    return true;
  const int r = PyObject_IsInstance(obj, THPVariableClass);
  if (r == -1) throw PyErrorAlreadySet{};
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
  Tensors(PyObject* seq, const char* name, bool allow_none = false)
      : seq_(PySequence_Fast(seq, (std::string(name) + " must be a list or tuple of tensors").c_str())) {
    n_ = size_t(PySequence_Fast_GET_SIZE(seq_.ok()));
    items_ = PySequence_Fast_ITEMS(seq_.get());
    for (size_t i = 0; i < n_; ++i) {
      if (allow_none && items_[i] == Py_None) continue;
      if (!is_tensor(items_[i]))
        type_error(std::string(name) + "[" + std::to_string(i) + "] is a " + Py_TYPE(items_[i])->tp_name +
                   ", not a tensor");
    }
  }
  size_t size() const { return n_; }
  bool none(size_t i) const { return items_[i] == Py_None; }
  const at::TensorBase& operator[](size_t i) const { return tensor_of(items_[i]); }

 private:
  Ref seq_;
  PyObject** items_ = nullptr;
  size_t n_ = 0;
};

DType grad_dtype(const at::TensorBase& g, const Where& w) {
  switch (g.scalar_type()) {
    case at::kFloat: return DType::F32;
    case at::kBFloat16: return DType::BF16;
    case at::kHalf: return DType::F16;
    default:
      type_error(w + ".grad has dtype " + std::string(c10::toString(g.scalar_type())) +
                           "; supported gradient dtypes are float32, bfloat16, float16");
  }
}

void check_fp32(const at::TensorBase& t, const at::TensorBase& p, const Where& w, const char* what) {
  if (!t.defined()) value_error(w + " " + what + " is missing");
  if (t.device().type() != at::kCPU) value_error(w + " " + what + " is on " + t.device().str() + ", not cpu");
  if (t.scalar_type() != at::kFloat)
    type_error(w + " " + what + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                         "; it must be float32");
  if (!t.is_contiguous())
    value_error(w + " " + what + " is not contiguous; updating a contiguous copy would lose the update");
  if (t.numel() != p.numel())
    value_error(w + " " + what + " has " + std::to_string(t.numel()) + " elements but the parameter has " +
                          std::to_string(p.numel()));
}

void check_param(const at::TensorBase& p, const Where& w) {
  if (!p.defined()) value_error(w + " is undefined");
  if (p.device().type() != at::kCPU)
    value_error(w + " is on device " + p.device().str() + "; CPU optimizers update cpu tensors only");
  if (p.scalar_type() != at::kFloat)
    type_error(w + " has dtype " + std::string(c10::toString(p.scalar_type())) +
                         "; CPU optimizers keep fp32 parameters");
  if (!p.is_contiguous())
    value_error(w + " is not contiguous; updating a contiguous copy would silently lose the update");
}

DType check_grad(const at::TensorBase& g, const at::TensorBase& p, const Where& w) {
  if (!g.defined()) value_error(w + ".grad is missing");
  if (g.device().type() != at::kCPU) value_error(w + ".grad is on " + g.device().str() + ", not cpu");
  DType d = grad_dtype(g, w);
  if (g.sizes() != p.sizes())
    value_error(w + ".grad has shape " + c10::str(g.sizes()) + " but the parameter has shape " +
                          c10::str(p.sizes()));
  if (!g.is_contiguous()) value_error(w + ".grad is not contiguous; the kernel reads gradients in place");
  return d;
}

DType check_out(const Tensors& outs, size_t i, const at::TensorBase& p, const Where& w, void** ptr) {
  *ptr = nullptr;
  if (outs.size() == 0 || outs.none(i)) return DType::None;
  const at::TensorBase& o = outs[i];
  if (o.device().type() != at::kCPU) value_error(w + " 16-bit output is on " + o.device().str());
  DType d;
  if (o.scalar_type() == at::kBFloat16) d = DType::BF16;
  else if (o.scalar_type() == at::kHalf) d = DType::F16;
  else
    type_error(w + " 16-bit output has dtype " + std::string(c10::toString(o.scalar_type())) +
                         "; it must be bfloat16 or float16");
  if (o.numel() != p.numel() || !o.is_contiguous())
    value_error(w + " 16-bit output must be contiguous with " + std::to_string(p.numel()) +
                          " elements, got " + std::to_string(o.numel()));
  *ptr = o.data_ptr();
  return d;
}

void check_lengths(size_t n, std::initializer_list<std::pair<const char*, size_t>> others, bool outs_empty_ok,
                   size_t outs) {
  for (auto& [name, len] : others)
    if (len != n)
      value_error(std::string(name) + " has " + std::to_string(len) + " entries but there are " +
                            std::to_string(n) + " params");
  if (!(outs_empty_ok && outs == 0) && outs != n)
    value_error("outs has " + std::to_string(outs) + " entries; pass [] or one per param (" +
                          std::to_string(n) + ")");
}

float* step_counter(const at::TensorBase& s, const Where& w) {
  if (!s.defined() || s.device().type() != at::kCPU || s.scalar_type() != at::kFloat || s.numel() != 1)
    value_error(w + " step must be a one-element float32 cpu tensor (torch's layout)");
  return s.data_ptr<float>();
}

dsfast::cpu::Isa isa_arg(const std::string& isa) {
  try {
    return dsfast::cpu::parse_isa(isa.c_str());
  } catch (const std::invalid_argument& e) {
    value_error(e.what());
  }
}

// One call = one parallel region over every tensor. Each step tensor is incremented
// here (torch increments before computing the bias corrections).
void adam_step(PyObject* params_, PyObject* grads_, PyObject* exp_avgs_, PyObject* exp_avg_sqs_,
               PyObject* outs_, PyObject* steps_, double lr, double beta1, double beta2, double eps,
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
    NoGil nogil;
    dsfast::cpu::adam_step(work.data(), int64_t(n), int(num_threads), isa_v);
  }
  for (float* s : counters) *s += 1.0f;
}

void sgd_step(PyObject* params_, PyObject* grads_, PyObject* momentum_buffers_, PyObject* outs_,
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
  NoGil nogil;
  dsfast::cpu::sgd_step(work.data(), int64_t(n), int(num_threads), isa_v);
}

// Runs one call, turning C++ exceptions into the Python exceptions pybind11 raised for them.
template <typename F>
PyObject* guarded(F&& body) {
  try {
    return body();
  } catch (const PyErrorAlreadySet&) {
  } catch (const PyError& e) {
    PyErr_SetString(e.type, e.message.c_str());
  } catch (const c10::Error& e) {  // as torch's own translator: the message without the C++ backtrace
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

const char* const kAdamArgs[] = {"params", "grads", "exp_avgs", "exp_avg_sqs", "outs", "steps", "lr", "beta1",
                                 "beta2", "eps", "weight_decay", "adamw", "bias_correction", "grad_scale",
                                 "num_threads", "isa", "label"};
const char* const kSGDArgs[] = {"params", "grads", "momentum_buffers", "outs", "first_steps", "lr", "momentum",
                                "dampening", "weight_decay", "nesterov", "grad_scale", "num_threads", "isa",
                                "label"};

PyObject* adam_step_py(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return guarded([&]() -> PyObject* {
    const Args a("adam_step", kAdamArgs, 17, 13, args, nargs, kwnames);
    // Every argument is converted before any tensor is looked at, as pybind11 did.
    const double lr = a.number(6, 0), beta1 = a.number(7, 0), beta2 = a.number(8, 0), eps = a.number(9, 0),
                 weight_decay = a.number(10, 0);
    const bool adamw = a.flag(11), bias_correction = a.flag(12);
    const double grad_scale = a.number(13, 1.0);
    const int64_t num_threads = a.integer(14, 0);
    const std::string isa = a.text(15, "auto"), label = a.text(16, "params");
    adam_step(a[0], a[1], a[2], a[3], a[4], a[5], lr, beta1, beta2, eps, weight_decay, adamw, bias_correction,
              grad_scale, num_threads, isa, label);
    Py_RETURN_NONE;
  });
}

PyObject* sgd_step_py(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  return guarded([&]() -> PyObject* {
    const Args a("sgd_step", kSGDArgs, 14, 10, args, nargs, kwnames);
    const std::vector<bool> first_steps = a.flags(4);
    const double lr = a.number(5, 0), momentum = a.number(6, 0), dampening = a.number(7, 0),
                 weight_decay = a.number(8, 0);
    const bool nesterov = a.flag(9);
    const double grad_scale = a.number(10, 1.0);
    const int64_t num_threads = a.integer(11, 0);
    const std::string isa = a.text(12, "auto"), label = a.text(13, "params");
    sgd_step(a[0], a[1], a[2], a[3], first_steps, lr, momentum, dampening, weight_decay, nesterov, grad_scale,
             num_threads, isa, label);
    Py_RETURN_NONE;
  });
}

PyObject* available_isas_py(PyObject*, PyObject*) {
  return guarded([]() -> PyObject* {
    Ref out(PyList_New(0));
    for (auto i : {dsfast::cpu::Isa::AVX512, dsfast::cpu::Isa::AVX2, dsfast::cpu::Isa::Scalar}) {
      if (!dsfast::cpu::isa_supported(i)) continue;
      Ref name(PyUnicode_FromString(dsfast::cpu::isa_name(i)));
      if (PyList_Append(out.ok(), name.ok()) != 0) throw PyErrorAlreadySet{};
    }
    Py_INCREF(out.ok());
    return out.get();
  });
}

PyObject* best_isa_py(PyObject*, PyObject*) {
  return guarded([]() -> PyObject* { return PyUnicode_FromString(dsfast::cpu::isa_name(dsfast::cpu::best_isa())); });
}

PyObject* openmp_enabled_py(PyObject*, PyObject*) {
  return guarded([]() -> PyObject* { return PyBool_FromLong(dsfast::cpu::openmp_enabled()); });
}

// Casting through void(*)(void) is the documented way to store a METH_FASTCALL function.
#define DSFAST_FN(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(f))
PyMethodDef kMethods[] = {
    {"adam_step", DSFAST_FN(adam_step_py), METH_FASTCALL | METH_KEYWORDS,
     "adam_step(params, grads, exp_avgs, exp_avg_sqs, outs, steps, lr, beta1, beta2, eps, weight_decay, adamw, "
     "bias_correction, grad_scale=1.0, num_threads=0, isa='auto', label='params')\n"
     "Adam/AdamW over a list of fp32 tensors (one parallel region)"},
    {"sgd_step", DSFAST_FN(sgd_step_py), METH_FASTCALL | METH_KEYWORDS,
     "sgd_step(params, grads, momentum_buffers, outs, first_steps, lr, momentum, dampening, weight_decay, "
     "nesterov, grad_scale=1.0, num_threads=0, isa='auto', label='params')\n"
     "SGD (momentum, dampening, nesterov, weight decay) over a list of fp32 tensors"},
    {"available_isas", available_isas_py, METH_NOARGS, "instruction sets this CPU can run, best first"},
    {"best_isa", best_isa_py, METH_NOARGS, "the instruction set 'auto' picks"},
    {"openmp_enabled", openmp_enabled_py, METH_NOARGS, "whether the kernels were built with OpenMP"},
    {nullptr, nullptr, 0, nullptr}};
#undef DSFAST_FN

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, nullptr,
                       "dsfast CPU optimizer kernels (Adam/AdamW/SGD; AVX-512/AVX2/scalar chosen at run time)",
                       -1, kMethods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

#define DSFAST_CAT2(a, b) a##b
#define DSFAST_CAT(a, b) DSFAST_CAT2(a, b)
#define DSFAST_STR2(a) #a
#define DSFAST_STR(a) DSFAST_STR2(a)

PyMODINIT_FUNC DSFAST_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  kModule.m_name = DSFAST_STR(TORCH_EXTENSION_NAME);
  return guarded([]() -> PyObject* {
    find_tensor_offset();
    return PyModule_Create(&kModule);
  });
}
