// Torch operators of the CPU optimizer kernels (dsfast::cpu_*): argument checks and dtype
// mapping only. The kernels (csrc/cpu) never see a torch header. Errors are
// ValueError/TypeError naming the tensor ("<label>[i]") and what would be valid.
//
// Registered with the dispatcher (op_abi.h), so FakeTensor, torch.compile and
// torch.library.opcheck see them; the fake (meta) implementations and the Python-facing
// functions are in dsfast/ops/native/cpu_optim.py.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../cpu/cpu_optim.h"
#include "op_abi.h"

using dsfast::cpu::DType;
using namespace dsfast::op;  // Tensor, Tensors, Flags, Text, value_error, type_error, ...

namespace {

// Names tensor i in error messages. Built only when an error is raised: a step over
// thousands of tensors must not allocate a string per tensor.
struct Where {
  Text label;
  size_t i;
  operator std::string() const { return str(label) + "[" + std::to_string(i) + "]"; }
};
std::string operator+(const Where& w, const char* s) { return std::string(w) + s; }

DType grad_dtype(const Tensor& g, const Where& w) {
  switch (g.scalar_type()) {
    case ScalarType::Float: return DType::F32;
    case ScalarType::BFloat16: return DType::BF16;
    case ScalarType::Half: return DType::F16;
    default:
      type_error(w + ".grad has dtype " + dtype_name(g.scalar_type()) +
                 "; supported gradient dtypes are float32, bfloat16, float16");
  }
}

DType float_dtype(ScalarType t) {
  return t == ScalarType::Float ? DType::F32 : t == ScalarType::BFloat16 ? DType::BF16
       : t == ScalarType::Half ? DType::F16 : DType::None;
}

// An optimizer state: fp32, or the (16-bit) parameter's own dtype (bf16_optimizer_states,
// fp32_optimizer_states=False).
DType check_state(const Tensor& t, const Tensor& p, const Where& w, const char* what) {
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
DType check_param(const Tensor& p, const Where& w) {
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

DType check_grad(const Tensor& g, const Tensor& p, const Where& w) {
  if (!g.defined()) value_error(w + ".grad is missing");
  if (!g.is_cpu()) value_error(w + ".grad is on " + device_name(g) + ", not cpu");
  DType d = grad_dtype(g, w);
  if (!same_sizes(g, p))
    value_error(w + ".grad has shape " + sizes_str(g) + " but the parameter has shape " + sizes_str(p));
  if (!g.is_contiguous()) value_error(w + ".grad is not contiguous; the kernel reads gradients in place");
  return d;
}

DType check_out(Tensors outs, size_t i, const Tensor& p, const Where& w, void** ptr) {
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

void check_lengths(size_t n, std::initializer_list<std::pair<const char*, size_t>> others, size_t outs) {
  for (auto& [name, len] : others)
    if (len != n)
      value_error(std::string(name) + " has " + std::to_string(len) + " entries but there are " +
                  std::to_string(n) + " params");
  if (outs != 0 && outs != n)
    value_error("outs has " + std::to_string(outs) + " entries; pass [] or one per param (" + std::to_string(n) +
                ")");
}

float* step_counter(const Tensor& s, const Where& w) {
  if (!s.defined() || !s.is_cpu() || s.scalar_type() != ScalarType::Float || s.numel() != 1)
    value_error(w + " step must be a one-element float32 cpu tensor (torch's layout)");
  return static_cast<float*>(s.mutable_data_ptr());
}

void* data(const Tensor& t) { return t.mutable_data_ptr(); }

dsfast::cpu::Isa isa_arg(Text isa) {
  try {
    return dsfast::cpu::parse_isa(str(isa).c_str());
  } catch (const std::invalid_argument& e) {
    value_error(e.what());
  }
}

// Stochastic rounding: the call's seed (0: off) made distinct per row, for bf16 params only (others round to
// nearest even whatever the call asks: an optimizer's groups may mix dtypes).
uint32_t row_seed(int64_t seed, size_t row, DType param) {
  if (seed == 0 || param != DType::BF16) return 0;
  uint32_t x = uint32_t(seed) ^ uint32_t(uint64_t(seed) >> 32) ^ (uint32_t(row) * 0x85EBCA6Bu);
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  x ^= x >> 12;
  return x ? x : 1u;
}

// A param's tensors, checked, as raw pointers: what the kernels need, from either the lists or a
// work table row.
struct AdamRow {
  dsfast::cpu::AdamTensor t;
  float* step;
};

std::vector<AdamRow> adam_rows(Tensors params, Tensors grads, Tensors exp_avgs, Tensors exp_avg_sqs, Tensors outs,
                               Tensors steps, Text label) {
  const size_t n = params.size();
  check_lengths(n, {{"grads", grads.size()}, {"exp_avgs", exp_avgs.size()}, {"exp_avg_sqs", exp_avg_sqs.size()},
                    {"steps", steps.size()}}, outs.size());
  std::vector<AdamRow> rows(n);
  for (size_t i = 0; i < n; ++i) {
    const Where w{label, i};
    const DType pd = check_param(params[i], w);
    DType gd = check_grad(grads[i], params[i], w);
    const DType sd = check_state(exp_avgs[i], params[i], w, "state['exp_avg']");
    if (check_state(exp_avg_sqs[i], params[i], w, "state['exp_avg_sq']") != sd)
      type_error(w + " state['exp_avg'] and state['exp_avg_sq'] have different dtypes");
    void* out = nullptr;
    DType od = check_out(outs, i, params[i], w, &out);
    rows[i] = {{data(params[i]), grads[i].const_data_ptr(), data(exp_avgs[i]), data(exp_avg_sqs[i]), out,
                params[i].numel(), gd, od, {}, pd, sd},
               step_counter(steps[i], w)};
  }
  return rows;
}

// One call = one parallel region over every tensor. Each step tensor is incremented
// here (torch increments before computing the bias corrections), as it is read: after the
// kernel's pass over memory each counter would be a cache miss again. A kernel that refuses
// (an ISA this CPU lacks) puts them back.
void run_adam(std::vector<AdamRow>& rows, double lr, double beta1, double beta2, double eps, double weight_decay,
              bool adamw, bool bias_correction, double grad_scale, int64_t num_threads, dsfast::cpu::Isa isa,
              int64_t round_seed) {
  std::vector<dsfast::cpu::AdamTensor> work(rows.size());
  int64_t last_step = -1;
  dsfast::AdamCoeffs c{};
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t step = int64_t(*rows[i].step) + 1;
    if (step != last_step) {  // bias corrections: once per distinct step count, not per tensor
      last_step = step;
      c = dsfast::make_adam_coeffs(lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, step);
      c.grad_scale = float(grad_scale);
    }
    work[i] = rows[i].t;
    work[i].coeffs = c;
    work[i].round_seed = row_seed(round_seed, i, work[i].param_dtype);
    *rows[i].step += 1.0f;
  }
  try {
    dsfast::cpu::adam_step(work.data(), int64_t(work.size()), int(num_threads), isa);
  } catch (...) {
    for (auto& r : rows) *r.step -= 1.0f;
    throw;
  }
}

void adam_step(Tensors params, Tensors grads, Tensors exp_avgs, Tensors exp_avg_sqs, Tensors outs, Tensors steps,
               double lr, double beta1, double beta2, double eps, double weight_decay, bool adamw,
               bool bias_correction, double grad_scale, int64_t num_threads, Text isa, Text label,
               int64_t round_seed) {
  const auto isa_v = isa_arg(isa);
  auto rows = adam_rows(params, grads, exp_avgs, exp_avg_sqs, outs, steps, label);
  release_lists(params, grads, exp_avgs, exp_avg_sqs, outs, steps);   // raw pointers from here on
  run_adam(rows, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, grad_scale, num_threads, isa_v,
           round_seed);
}

// 8-bit block-wise moments (cpu_optim.h's Adam8bitTensor): uint8 codes, one per element, and fp32 scales, one per
// block of kQuantBlock elements.
void* check_codes(const Tensor& t, const Tensor& p, const Where& w, const char* what) {
  if (!t.defined() || !t.is_cpu() || t.scalar_type() != ScalarType::Byte || !t.is_contiguous() ||
      t.numel() != p.numel())
    value_error(w + " " + what + " must be a contiguous uint8 cpu tensor of " + std::to_string(p.numel()) +
                " elements (one code per parameter element)");
  return t.mutable_data_ptr();
}

float* check_scales(const Tensor& t, const Tensor& p, const Where& w, const char* what) {
  const int64_t blocks = (p.numel() + dsfast::cpu::kQuantBlock - 1) / dsfast::cpu::kQuantBlock;
  if (!t.defined() || !t.is_cpu() || t.scalar_type() != ScalarType::Float || !t.is_contiguous() ||
      t.numel() != blocks)
    value_error(w + " " + what + " must be a contiguous float32 cpu tensor of " + std::to_string(blocks) +
                " elements (one scale per block of " + std::to_string(dsfast::cpu::kQuantBlock) + ")");
  return static_cast<float*>(t.mutable_data_ptr());
}

void adam8bit_step(Tensors params, Tensors grads, Tensors exp_avg_codes, Tensors exp_avg_scales,
                   Tensors exp_avg_sq_codes, Tensors exp_avg_sq_scales, Tensors outs, Tensors steps,
                   double lr, double beta1, double beta2, double eps, double weight_decay, bool adamw,
                   bool bias_correction, double grad_scale, int64_t num_threads, Text isa, Text label, int64_t round_seed) {
  const auto isa_v = isa_arg(isa);
  const size_t n = params.size();
  check_lengths(n, {{"grads", grads.size()}, {"exp_avg_codes", exp_avg_codes.size()},
                    {"exp_avg_scales", exp_avg_scales.size()}, {"exp_avg_sq_codes", exp_avg_sq_codes.size()},
                    {"exp_avg_sq_scales", exp_avg_sq_scales.size()}, {"steps", steps.size()}}, outs.size());
  std::vector<dsfast::cpu::Adam8bitTensor> work(n);
  std::vector<float*> counters(n);
  for (size_t i = 0; i < n; ++i) {
    const Where w{label, i};
    const DType pd = check_param(params[i], w);
    if (pd == DType::F16) type_error(w + " is float16; 8-bit states step float32 or bfloat16 params");
    const DType gd = check_grad(grads[i], params[i], w);
    void* out = nullptr;
    const DType od = check_out(outs, i, params[i], w, &out);
    auto& t = work[i];
    t.param = data(params[i]);
    t.grad = grads[i].const_data_ptr();
    t.exp_avg_codes = static_cast<uint8_t*>(check_codes(exp_avg_codes[i], params[i], w, "state['exp_avg_codes']"));
    t.exp_avg_scales = check_scales(exp_avg_scales[i], params[i], w, "state['exp_avg_scales']");
    t.exp_avg_sq_codes =
        static_cast<uint8_t*>(check_codes(exp_avg_sq_codes[i], params[i], w, "state['exp_avg_sq_codes']"));
    t.exp_avg_sq_scales = check_scales(exp_avg_sq_scales[i], params[i], w, "state['exp_avg_sq_scales']");
    t.out16 = out;
    t.numel = params[i].numel();
    t.grad_dtype = gd;
    t.out_dtype = od;
    t.param_dtype = pd;
    t.round_seed = row_seed(round_seed, i, pd);
    if (t.numel == 0) { t.out16 = nullptr; t.out_dtype = DType::None; }   // an empty tensor has no data pointer
    counters[i] = step_counter(steps[i], w);
  }
  release_lists(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs, steps);
  int64_t last_step = -1;
  dsfast::AdamCoeffs c{};
  for (size_t i = 0; i < n; ++i) {
    const int64_t step = int64_t(*counters[i]) + 1;
    if (step != last_step) {
      last_step = step;
      c = dsfast::make_adam_coeffs(lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, step);
      c.grad_scale = float(grad_scale);
    }
    work[i].coeffs = c;
  }
  try {
    dsfast::cpu::adam8bit_step(work.data(), int64_t(n), int(num_threads), isa_v);
  } catch (const std::invalid_argument& e) {
    value_error(e.what());
  }
  for (float* s : counters) *s += 1.0f;
}

std::vector<dsfast::cpu::SGDTensor> sgd_rows(Tensors params, Tensors grads, Tensors momentum_buffers, Tensors outs,
                                             bool mom, Text label) {
  const size_t n = params.size();
  check_lengths(n, {{"grads", grads.size()}}, outs.size());
  if (mom) check_lengths(n, {{"momentum_buffers", momentum_buffers.size()}}, 0);
  std::vector<dsfast::cpu::SGDTensor> rows(n);
  for (size_t i = 0; i < n; ++i) {
    const Where w{label, i};
    const DType pd = check_param(params[i], w);
    DType gd = check_grad(grads[i], params[i], w);
    void* buf = nullptr;
    DType sd = DType::F32;
    if (mom) {
      sd = check_state(momentum_buffers[i], params[i], w, "state['momentum_buffer']");
      buf = data(momentum_buffers[i]);
    }
    void* out = nullptr;
    DType od = check_out(outs, i, params[i], w, &out);
    rows[i] = {data(params[i]), grads[i].const_data_ptr(), buf, out, params[i].numel(), gd, od, {}, pd, sd};
  }
  return rows;
}

void sgd_step(Tensors params, Tensors grads, Tensors momentum_buffers, Tensors outs, Flags first_steps, double lr,
              double momentum, double dampening, double weight_decay, bool nesterov, double grad_scale,
              int64_t num_threads, Text isa, Text label, int64_t round_seed) {
  const bool mom = momentum != 0.0;
  const auto isa_v = isa_arg(isa);
  auto work = sgd_rows(params, grads, momentum_buffers, outs, mom, label);
  if (mom) check_lengths(params.size(), {{"first_steps", first_steps.size()}}, 0);
  for (size_t i = 0; i < work.size(); ++i) {
    work[i].coeffs = dsfast::make_sgd_coeffs(lr, momentum, dampening, weight_decay, nesterov, mom && first_steps[i]);
    work[i].coeffs.grad_scale = float(grad_scale);
    work[i].round_seed = row_seed(round_seed, i, work[i].param_dtype);
  }
  release_lists(params, grads, momentum_buffers, outs);
  dsfast::cpu::sgd_step(work.data(), int64_t(work.size()), int(num_threads), isa_v);
}

// ---- Adagrad and Lion: one state per param (Adagrad's sum of squares, Lion's momentum) and a step count each,
// incremented here as run_adam does (neither rule reads it: it is the optimizer's state, as torch's and DeepSpeed's).
template <class Coeffs>
std::vector<dsfast::cpu::OneStateTensor<Coeffs>> one_state_rows(Tensors params, Tensors grads, Tensors states,
                                                                 Tensors outs, Tensors steps, const Coeffs& c,
                                                                 const char* state_name, Text label,
                                                                 int64_t round_seed, std::vector<float*>& counters) {
  const size_t n = params.size();
  check_lengths(n, {{"grads", grads.size()}, {"states", states.size()}, {"steps", steps.size()}}, outs.size());
  std::vector<dsfast::cpu::OneStateTensor<Coeffs>> rows(n);
  counters.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Where w{label, i};
    const DType pd = check_param(params[i], w);
    const DType gd = check_grad(grads[i], params[i], w);
    const DType sd = check_state(states[i], params[i], w, state_name);
    void* out = nullptr;
    const DType od = check_out(outs, i, params[i], w, &out);
    rows[i] = {data(params[i]), grads[i].const_data_ptr(), data(states[i]), out, params[i].numel(), gd, od, c, pd,
               sd, row_seed(round_seed, i, pd)};
    counters[i] = step_counter(steps[i], w);
  }
  return rows;
}

// Runs `step` over the rows, the step counts incremented first and put back if the kernel refuses.
template <class Row, class Step>
void run_counted(std::vector<Row>& rows, std::vector<float*>& counters, int64_t num_threads,
                 dsfast::cpu::Isa isa, Step step) {
  for (float* s : counters) *s += 1.0f;
  try {
    step(rows.data(), int64_t(rows.size()), int(num_threads), isa);
  } catch (...) {
    for (float* s : counters) *s -= 1.0f;
    throw;
  }
}

void adagrad_step(Tensors params, Tensors grads, Tensors state_sums, Tensors outs, Tensors steps, double lr,
                  double eps, double weight_decay, double grad_scale, int64_t num_threads, Text isa, Text label,
                  int64_t round_seed) {
  const auto isa_v = isa_arg(isa);
  auto c = dsfast::make_adagrad_coeffs(lr, eps, weight_decay);
  c.grad_scale = float(grad_scale);
  std::vector<float*> counters;
  auto rows = one_state_rows(params, grads, state_sums, outs, steps, c, "state['exp_avg_sq']", label, round_seed,
                             counters);
  release_lists(params, grads, state_sums, outs, steps);
  run_counted(rows, counters, num_threads, isa_v, dsfast::cpu::adagrad_step);
}

void lion_step(Tensors params, Tensors grads, Tensors exp_avgs, Tensors outs, Tensors steps, double lr, double beta1,
               double beta2, double weight_decay, double grad_scale, int64_t num_threads, Text isa, Text label,
               int64_t round_seed) {
  const auto isa_v = isa_arg(isa);
  auto c = dsfast::make_lion_coeffs(lr, beta1, beta2, weight_decay);
  c.grad_scale = float(grad_scale);
  std::vector<float*> counters;
  auto rows = one_state_rows(params, grads, exp_avgs, outs, steps, c, "state['exp_avg']", label, round_seed,
                             counters);
  release_lists(params, grads, exp_avgs, outs, steps);
  run_counted(rows, counters, num_threads, isa_v, dsfast::cpu::lion_step);
}

// ---- Work tables: the eager fast path of CPUAdam / CPUSGD / CPUAdagrad / CPULion (dsfast/optim/_cpu_op.py).
// A table is an int64 cpu tensor with one row per param: its tensors' addresses, numel and dtype
// codes, written by the *_table_fill_ ops after the same checks as the list ops, and a strong
// reference to each of those tensors (op_abi.h hold()), given back by cpu_table_release_. A step then
// passes one tensor instead of thousands: converting and freeing 12000 list entries costs ~4 ms when
// the frees come after the kernel's pass over 1 GB (every TensorImpl a cache miss). Before writing
// anything a step checks, through those references, that every tensor still has the address and size
// it was filled with (p.data = ..., set_(), resize_() move them); if one moved it raises a ValueError
// tagged kStale, which the Python wrapper turns into False, and the caller rebuilds the table (a
// mutating op must return nothing for torch.compile to functionalise it). The check is one loop in
// C++ over both threads: ~6x cheaper than Python's data_ptr() calls once the kernel's pass over a
// gigabyte has evicted every TensorImpl.
constexpr const char* kStale = "[dsfast:stale-table] ";
[[noreturn]] void stale(const char* op) {
  value_error(std::string(kStale) + op + ": a tensor of the work table moved since it was filled");
}

enum AdamCol : int64_t {
  kAP, kAG, kAM, kAV, kAOut, kAStep, kANumel, kAGd, kAOd, kAPd, kASd, kAHeld, kAdamCols = kAHeld + 6
};
enum SgdCol : int64_t { kSP, kSG, kSBuf, kSOut, kSNumel, kSGd, kSOd, kSPd, kSSd, kSHeld, kSgdCols = kSHeld + 4 };

int64_t* table_data(const OwnedTensor& t, int64_t rows, int64_t cols, const char* op) {
  auto fail = [&] {
    value_error(std::string(op) + ": the work table must be a contiguous int64 cpu tensor of shape [" +
                (rows < 0 ? std::string("n") : std::to_string(rows)) + ", " + std::to_string(cols) + "]");
  };
  if (!t.is_cpu() || t.scalar_type() != ScalarType::Long || t.dim() != 2 || t.size(1) != cols ||
      !t.is_contiguous() || (rows >= 0 && t.size(0) != rows))
    fail();
  return static_cast<int64_t*>(t.mutable_data_ptr());
}

template <typename P>
int64_t addr(P* p) { return int64_t(reinterpret_cast<intptr_t>(p)); }
template <typename P>
P* ptr(int64_t a) { return reinterpret_cast<P*>(intptr_t(a)); }

// A param or state dtype code: F32, BF16 or F16.
DType float_code(int64_t code, const char* op, int64_t row) {
  if (code < int64_t(DType::F32) || code > int64_t(DType::F16))
    value_error(std::string(op) + ": row " + std::to_string(row) + " of the work table is corrupt");
  return DType(code);
}

DType dtype_code(int64_t code, bool out, void* p, const char* op, int64_t row) {
  const bool ok = out ? (p == nullptr ? code == int64_t(DType::None)
                                       : code == int64_t(DType::BF16) || code == int64_t(DType::F16))
                      : (p != nullptr && code >= int64_t(DType::F32) && code <= int64_t(DType::F16));
  if (!ok) value_error(std::string(op) + ": row " + std::to_string(row) + " of the work table is corrupt");
  return DType(code);
}

// Whether the tensors of one row still have the addresses in columns addr_cols and `numel` elements
// (the step counter: 1), read through their references in columns held_col... A row without a
// reference for an address (released, or never filled) is stale, unless that tensor is absent (a
// null address: no 16-bit output, no momentum buffer).
bool row_current(const int64_t* d, const int64_t* addr_cols, int n, int64_t held_col, int64_t numel,
                 int64_t step_col) {
  for (int k = 0; k < n; ++k) {
    const int64_t h = d[held_col + k], a = d[addr_cols[k]];
    if (h == 0) {
      if (a != 0) return false;
      continue;
    }
    const auto& t = held(h);
    if (addr(t.mutable_data_ptr()) != a || t.numel() != (addr_cols[k] == step_col ? 1 : numel)) return false;
  }
  return true;
}

// Whether rows [0, n) pass row_ok(i), the rows split over the threads: each check is a few cache
// misses independent of the others, so two threads halve the wait. A check that throws (a tensor
// whose data cannot be read) fails its row instead of leaving the parallel region.
template <class RowOk>
bool all_rows(int64_t n, int64_t num_threads, RowOk row_ok) {
  auto ok = [&](int64_t i) {
    try {
      return row_ok(i);
    } catch (...) {
      return false;
    }
  };
  bool all = true;
#ifdef _OPENMP
  const int threads = num_threads > 0 ? int(num_threads) : omp_get_max_threads();
  if (threads > 1 && n >= 256) {
#pragma omp parallel for num_threads(threads) schedule(static) reduction(&& : all)
    for (int64_t i = 0; i < n; ++i) all = all && ok(i);
    return all;
  }
#endif
  for (int64_t i = 0; i < n && all; ++i) all = ok(i);
  return all;
}

void hold_row(int64_t* d, int64_t held_col, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) d[held_col++] = t ? hold(*t) : 0;
}

void adam_table_fill(const OwnedTensor& table, Tensors params, Tensors grads, Tensors exp_avgs, Tensors exp_avg_sqs,
                     Tensors outs, Tensors steps, Text label) {
  int64_t* d = table_data(table, int64_t(params.size()), kAdamCols, "cpu_adam_table_fill_");
  const auto rows = adam_rows(params, grads, exp_avgs, exp_avg_sqs, outs, steps, label);  // checks all first
  for (size_t i = 0; i < rows.size(); ++i, d += kAdamCols) {
    const AdamRow& r = rows[i];
    d[kAP] = addr(r.t.param), d[kAG] = addr(r.t.grad), d[kAM] = addr(r.t.exp_avg), d[kAV] = addr(r.t.exp_avg_sq);
    d[kAOut] = addr(r.t.out16), d[kAStep] = addr(r.step), d[kANumel] = r.t.numel;
    d[kAGd] = int64_t(r.t.grad_dtype), d[kAOd] = int64_t(r.t.out_dtype);
    d[kAPd] = int64_t(r.t.param_dtype), d[kASd] = int64_t(r.t.state_dtype);
    const Tensor p = params[i], g = grads[i], m = exp_avgs[i], v = exp_avg_sqs[i], st = steps[i];
    const Tensor o = outs.empty() ? p : outs[i];
    hold_row(d, kAHeld, {&p, &g, &m, &v, outs.empty() ? nullptr : &o, &st});
  }
}

void adam_table_step(const OwnedTensor& table, double lr, double beta1, double beta2, double eps,
                     double weight_decay, bool adamw, bool bias_correction, double grad_scale, int64_t num_threads,
                     Text isa, int64_t round_seed) {
  const char* op = "cpu_adam_table_";
  const int64_t* d = table_data(table, -1, kAdamCols, op);
  const auto isa_v = isa_arg(isa);
  static constexpr int64_t kCols[] = {kAP, kAG, kAM, kAV, kAOut, kAStep};
  std::vector<AdamRow> rows(size_t(table.size(0)));
  if (!all_rows(int64_t(rows.size()), num_threads, [&](int64_t i) {
        const int64_t* r = d + i * kAdamCols;
        return row_current(r, kCols, 6, kAHeld, r[kANumel], kAStep);
      }))
    stale(op);
  for (size_t i = 0; i < rows.size(); ++i, d += kAdamCols) {
    void* out = ptr<void>(d[kAOut]);
    rows[i] = {{ptr<void>(d[kAP]), ptr<const void>(d[kAG]), ptr<void>(d[kAM]), ptr<void>(d[kAV]), out,
                d[kANumel], dtype_code(d[kAGd], false, ptr<void>(d[kAG]), op, int64_t(i)),
                dtype_code(d[kAOd], true, out, op, int64_t(i)), {}, float_code(d[kAPd], op, int64_t(i)),
                float_code(d[kASd], op, int64_t(i))},
               ptr<float>(d[kAStep])};
  }
  run_adam(rows, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, grad_scale, num_threads, isa_v,
           round_seed);
}

void sgd_table_fill(const OwnedTensor& table, Tensors params, Tensors grads, Tensors momentum_buffers, Tensors outs,
                    Text label) {
  int64_t* d = table_data(table, int64_t(params.size()), kSgdCols, "cpu_sgd_table_fill_");
  const bool mom = momentum_buffers.size() != 0;
  const auto rows = sgd_rows(params, grads, momentum_buffers, outs, mom, label);   // checks all first
  for (size_t i = 0; i < rows.size(); ++i, d += kSgdCols) {
    const auto& r = rows[i];
    d[kSP] = addr(r.param), d[kSG] = addr(r.grad), d[kSBuf] = addr(r.momentum_buf), d[kSOut] = addr(r.out16);
    d[kSNumel] = r.numel, d[kSGd] = int64_t(r.grad_dtype), d[kSOd] = int64_t(r.out_dtype);
    d[kSPd] = int64_t(r.param_dtype), d[kSSd] = int64_t(r.state_dtype);
    const Tensor p = params[i], g = grads[i];
    const Tensor b = mom ? momentum_buffers[i] : p, o = outs.empty() ? p : outs[i];
    hold_row(d, kSHeld, {&p, &g, mom ? &b : nullptr, outs.empty() ? nullptr : &o});
  }
}

// Every momentum buffer already holds a step's average (a first step, which seeds them, takes the
// list op).
void sgd_table_step(const OwnedTensor& table, double lr, double momentum, double dampening, double weight_decay,
                    bool nesterov, double grad_scale, int64_t num_threads, Text isa, int64_t round_seed) {
  const char* op = "cpu_sgd_table_";
  const int64_t* d = table_data(table, -1, kSgdCols, op);
  const auto isa_v = isa_arg(isa);
  auto c = dsfast::make_sgd_coeffs(lr, momentum, dampening, weight_decay, nesterov, false);
  c.grad_scale = float(grad_scale);
  static constexpr int64_t kCols[] = {kSP, kSG, kSBuf, kSOut};
  std::vector<dsfast::cpu::SGDTensor> work(size_t(table.size(0)));
  if (!all_rows(int64_t(work.size()), num_threads, [&](int64_t i) {
        const int64_t* r = d + i * kSgdCols;
        return row_current(r, kCols, 4, kSHeld, r[kSNumel], -1);
      }))
    stale(op);
  for (size_t i = 0; i < work.size(); ++i, d += kSgdCols) {
    void* out = ptr<void>(d[kSOut]);
    void* buf = ptr<void>(d[kSBuf]);
    if (momentum != 0.0 && buf == nullptr)
      value_error(std::string(op) + ": row " + std::to_string(i) +
                  " has no momentum buffer (the table was filled for momentum 0)");
    const DType gd = dtype_code(d[kSGd], false, ptr<void>(d[kSG]), op, int64_t(i));
    work[i] = {ptr<void>(d[kSP]), ptr<const void>(d[kSG]), buf, out, d[kSNumel], gd,
               dtype_code(d[kSOd], true, out, op, int64_t(i)), c, float_code(d[kSPd], op, int64_t(i)),
               float_code(d[kSSd], op, int64_t(i))};
    work[i].round_seed = row_seed(round_seed, i, work[i].param_dtype);
  }
  dsfast::cpu::sgd_step(work.data(), int64_t(work.size()), int(num_threads), isa_v);
}

// Adagrad's and Lion's tables: one layout (one state per param) filled by one op, stepped by each rule's op.
enum OneCol : int64_t { kOP, kOG, kOS, kOOut, kOStep, kONumel, kOGd, kOOd, kOPd, kOSd, kOHeld, kOneCols = kOHeld + 5 };

void one_state_table_fill(const OwnedTensor& table, Tensors params, Tensors grads, Tensors states, Tensors outs,
                          Tensors steps, Text state_key, Text label) {
  int64_t* d = table_data(table, int64_t(params.size()), kOneCols, "cpu_one_state_table_fill_");
  const std::string state_name = "state['" + str(state_key) + "']";
  std::vector<float*> counters;
  const auto rows = one_state_rows(params, grads, states, outs, steps, dsfast::AdagradCoeffs{}, state_name.c_str(),
                                   label, 0, counters);   // checks all first
  for (size_t i = 0; i < rows.size(); ++i, d += kOneCols) {
    const auto& r = rows[i];
    d[kOP] = addr(r.param), d[kOG] = addr(r.grad), d[kOS] = addr(r.state), d[kOOut] = addr(r.out16);
    d[kOStep] = addr(counters[i]), d[kONumel] = r.numel;
    d[kOGd] = int64_t(r.grad_dtype), d[kOOd] = int64_t(r.out_dtype);
    d[kOPd] = int64_t(r.param_dtype), d[kOSd] = int64_t(r.state_dtype);
    const Tensor p = params[i], g = grads[i], st = states[i], c = steps[i];
    const Tensor o = outs.empty() ? p : outs[i];
    hold_row(d, kOHeld, {&p, &g, &st, outs.empty() ? nullptr : &o, &c});
  }
}

// Runs `step` (adagrad_step / lion_step) with coefficients c over the tensors of a one-state table, as
// adam_table_step does: every row checked current first, else a kStale error and nothing written.
template <class Coeffs, class Step>
void one_state_table_step(const OwnedTensor& table, const char* op, const Coeffs& c, int64_t num_threads, Text isa,
                          int64_t round_seed, Step step) {
  const int64_t* d = table_data(table, -1, kOneCols, op);
  const auto isa_v = isa_arg(isa);
  static constexpr int64_t kCols[] = {kOP, kOG, kOS, kOOut, kOStep};
  const size_t n = size_t(table.size(0));
  if (!all_rows(int64_t(n), num_threads, [&](int64_t i) {
        const int64_t* r = d + i * kOneCols;
        return row_current(r, kCols, 5, kOHeld, r[kONumel], kOStep);
      }))
    stale(op);
  std::vector<dsfast::cpu::OneStateTensor<Coeffs>> rows(n);
  std::vector<float*> counters(n);
  for (size_t i = 0; i < n; ++i, d += kOneCols) {
    void* out = ptr<void>(d[kOOut]);
    const DType pd = float_code(d[kOPd], op, int64_t(i));
    rows[i] = {ptr<void>(d[kOP]), ptr<const void>(d[kOG]), ptr<void>(d[kOS]), out, d[kONumel],
               dtype_code(d[kOGd], false, ptr<void>(d[kOG]), op, int64_t(i)),
               dtype_code(d[kOOd], true, out, op, int64_t(i)), c, pd, float_code(d[kOSd], op, int64_t(i)),
               row_seed(round_seed, i, pd)};
    counters[i] = ptr<float>(d[kOStep]);
  }
  run_counted(rows, counters, num_threads, isa_v, step);
}

void adagrad_table_step(const OwnedTensor& table, double lr, double eps, double weight_decay, double grad_scale,
                        int64_t num_threads, Text isa, int64_t round_seed) {
  auto c = dsfast::make_adagrad_coeffs(lr, eps, weight_decay);
  c.grad_scale = float(grad_scale);
  one_state_table_step(table, "cpu_adagrad_table_", c, num_threads, isa, round_seed, dsfast::cpu::adagrad_step);
}

void lion_table_step(const OwnedTensor& table, double lr, double beta1, double beta2, double weight_decay,
                     double grad_scale, int64_t num_threads, Text isa, int64_t round_seed) {
  auto c = dsfast::make_lion_coeffs(lr, beta1, beta2, weight_decay);
  c.grad_scale = float(grad_scale);
  one_state_table_step(table, "cpu_lion_table_", c, num_threads, isa, round_seed, dsfast::cpu::lion_step);
}

// Gives back the references of a table's held columns (a copy of them: the table itself may be
// gone) and zeroes them, so a second release is a no-op.
void table_release(const OwnedTensor& held_cols) {
  if (!held_cols.is_cpu() || held_cols.scalar_type() != ScalarType::Long || !held_cols.is_contiguous())
    value_error("cpu_table_release_: expects a contiguous int64 cpu tensor of held references");
  auto* h = static_cast<int64_t*>(held_cols.mutable_data_ptr());
  for (int64_t i = 0, n = held_cols.numel(); i < n; ++i) {
    drop(h[i]);
    h[i] = 0;
  }
}

// Instruction sets this CPU can run, best first, comma-separated (a str keeps the schema
// to types both ABIs return).
std::string available_isas() {
  std::string out;
  for (auto i : {dsfast::cpu::Isa::AVX512, dsfast::cpu::Isa::AVX2, dsfast::cpu::Isa::Scalar})
    if (dsfast::cpu::isa_supported(i)) out += (out.empty() ? "" : ",") + std::string(dsfast::cpu::isa_name(i));
  return out;
}

bool openmp_enabled() { return dsfast::cpu::openmp_enabled(); }

std::string abi() { return kAbi; }

}  // namespace

DSFAST_LIBRARY(m) {
  m.def("cpu_adam_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "Tensor(d!)[] outs, Tensor(e!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "bool adamw, bool bias_correction, float grad_scale=1.0, int num_threads=0, str isa=\"auto\", "
        "str label=\"params\", int round_seed=0) -> ()");
  m.def("cpu_sgd_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, Tensor(c!)[] outs, "
        "bool[] first_steps, float lr, float momentum, float dampening, float weight_decay, bool nesterov, "
        "float grad_scale=1.0, int num_threads=0, str isa=\"auto\", str label=\"params\", int round_seed=0) -> ()");
  m.def("cpu_adagrad_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] state_sums, Tensor(c!)[] outs, "
        "Tensor(d!)[] steps, float lr, float eps, float weight_decay, float grad_scale=1.0, int num_threads=0, "
        "str isa=\"auto\", str label=\"params\", int round_seed=0) -> ()");
  m.def("cpu_lion_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] outs, "
        "Tensor(d!)[] steps, float lr, float beta1, float beta2, float weight_decay, float grad_scale=1.0, "
        "int num_threads=0, str isa=\"auto\", str label=\"params\", int round_seed=0) -> ()");
  // Work tables (see adam_table_fill). The step ops write through the table's addresses; the
  // table is marked mutated so that no graph treats a step as free of side effects.
  m.def("cpu_adam_table_fill_(Tensor(a!) table, Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, "
        "Tensor[] exp_avg_sqs, Tensor[] outs, Tensor[] steps, str label=\"params\") -> ()");
  m.def("cpu_adam_table_(Tensor(a!) table, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "bool adamw, bool bias_correction, float grad_scale=1.0, int num_threads=0, str isa=\"auto\", "
        "int round_seed=0) -> ()");
  m.def("cpu_sgd_table_fill_(Tensor(a!) table, Tensor[] params, Tensor[] grads, Tensor[] momentum_buffers, "
        "Tensor[] outs, str label=\"params\") -> ()");
  m.def("cpu_sgd_table_(Tensor(a!) table, float lr, float momentum, float dampening, float weight_decay, "
        "bool nesterov, float grad_scale=1.0, int num_threads=0, str isa=\"auto\", int round_seed=0) -> ()");
  m.def("cpu_one_state_table_fill_(Tensor(a!) table, Tensor[] params, Tensor[] grads, Tensor[] states, "
        "Tensor[] outs, Tensor[] steps, str state_key=\"state\", str label=\"params\") -> ()");
  m.def("cpu_adagrad_table_(Tensor(a!) table, float lr, float eps, float weight_decay, float grad_scale=1.0, "
        "int num_threads=0, str isa=\"auto\", int round_seed=0) -> ()");
  m.def("cpu_lion_table_(Tensor(a!) table, float lr, float beta1, float beta2, float weight_decay, "
        "float grad_scale=1.0, int num_threads=0, str isa=\"auto\", int round_seed=0) -> ()");
  m.def("cpu_adam8bit_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avg_codes, "
        "Tensor(c!)[] exp_avg_scales, Tensor(d!)[] exp_avg_sq_codes, Tensor(e!)[] exp_avg_sq_scales, "
        "Tensor(f!)[] outs, Tensor(g!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "bool adamw, bool bias_correction, float grad_scale=1.0, "
        "int num_threads=0, str isa=\"auto\", str label=\"params\", int round_seed=0) -> ()");
  m.def("cpu_table_release_(Tensor(a!) held) -> ()");
  m.def("cpu_available_isas() -> str");
  m.def("cpu_openmp_enabled() -> bool");
  m.def("cpu_optim_abi() -> str");
}

DSFAST_LIBRARY_IMPL(CPU, m) {
  m.impl("cpu_adam_step", DSFAST_KERNEL(adam_step));
  m.impl("cpu_sgd_step", DSFAST_KERNEL(sgd_step));
  m.impl("cpu_adagrad_step", DSFAST_KERNEL(adagrad_step));
  m.impl("cpu_lion_step", DSFAST_KERNEL(lion_step));
  m.impl("cpu_adam_table_fill_", DSFAST_KERNEL(adam_table_fill));
  m.impl("cpu_adam_table_", DSFAST_KERNEL(adam_table_step));
  m.impl("cpu_sgd_table_fill_", DSFAST_KERNEL(sgd_table_fill));
  m.impl("cpu_sgd_table_", DSFAST_KERNEL(sgd_table_step));
  m.impl("cpu_one_state_table_fill_", DSFAST_KERNEL(one_state_table_fill));
  m.impl("cpu_adagrad_table_", DSFAST_KERNEL(adagrad_table_step));
  m.impl("cpu_lion_table_", DSFAST_KERNEL(lion_table_step));
  m.impl("cpu_table_release_", DSFAST_KERNEL(table_release));
  m.impl("cpu_adam8bit_step", DSFAST_KERNEL(adam8bit_step));
}

// No tensor arguments: nothing to dispatch on, so one kernel for every backend.
DSFAST_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  m.impl("cpu_available_isas", DSFAST_KERNEL(available_isas));
  m.impl("cpu_openmp_enabled", DSFAST_KERNEL(openmp_enabled));
  m.impl("cpu_optim_abi", DSFAST_KERNEL(abi));
}
