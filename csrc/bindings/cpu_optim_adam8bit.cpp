// Torch operators of the CPU Adam / AdamW kernel with 8-bit block-wise moments: the list op (cpu_adam8bit_step)
// and the work-table ops (cpu_adam8bit_table_fill_, cpu_adam8bit_table_);
// the rest of the cpu_optim op is in the other cpu_optim*.cpp files, the fake (meta)
// implementation in dsfast/ops/native/cpu_optim.py.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_optim_checks.h"
#include "cpu_optim_table.h"

using namespace dsfast::cpu_bind;

namespace {

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

// A param's tensors, checked, as raw pointers: from the lists or a work table row (cpu_optim_adam.cpp's AdamRow).
struct Adam8bitRow {
  dsfast::cpu::Adam8bitTensor t;
  float* step;
};

std::vector<Adam8bitRow> adam8bit_rows(Tensors params, Tensors grads, Tensors exp_avg_codes, Tensors exp_avg_scales,
                                       Tensors exp_avg_sq_codes, Tensors exp_avg_sq_scales, Tensors outs,
                                       Tensors steps, Text label) {
  const size_t n = params.size();
  check_lengths(n, {{"grads", grads.size()}, {"exp_avg_codes", exp_avg_codes.size()},
                    {"exp_avg_scales", exp_avg_scales.size()}, {"exp_avg_sq_codes", exp_avg_sq_codes.size()},
                    {"exp_avg_sq_scales", exp_avg_sq_scales.size()}, {"steps", steps.size()}}, outs.size());
  std::vector<Adam8bitRow> rows(n);
  for (size_t i = 0; i < n; ++i) {
    const Where w{label, i};
    const DType pd = check_param(params[i], w);
    if (pd == DType::F16) type_error(w + " is float16; 8-bit states step float32 or bfloat16 params");
    const DType gd = check_grad(grads[i], params[i], w);
    void* out = nullptr;
    const DType od = check_out(outs, i, params[i], w, &out);
    auto& t = rows[i].t;
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
    if (t.numel == 0) { t.out16 = nullptr; t.out_dtype = DType::None; }   // an empty tensor has no data pointer
    rows[i].step = step_counter(steps[i], w);
  }
  return rows;
}

// One parallel region over every tensor; the step counters incremented as they are read, put back if the kernel
// refuses (cpu_optim_adam.cpp's run_adam).
void run_adam8bit(std::vector<Adam8bitRow>& rows, double lr, double beta1, double beta2, double eps,
                  double weight_decay, bool adamw, bool bias_correction, double grad_scale, int64_t num_threads,
                  dsfast::cpu::Isa isa, int64_t round_seed) {
  std::vector<dsfast::cpu::Adam8bitTensor> work(rows.size());
  int64_t last_step = -1;
  dsfast::AdamCoeffs c{};
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t step = int64_t(*rows[i].step) + 1;
    if (step != last_step) {
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
    dsfast::cpu::adam8bit_step(work.data(), int64_t(work.size()), int(num_threads), isa);
  } catch (const std::invalid_argument& e) {
    for (auto& r : rows) *r.step -= 1.0f;
    value_error(e.what());
  } catch (...) {
    for (auto& r : rows) *r.step -= 1.0f;
    throw;
  }
}

void adam8bit_step(Tensors params, Tensors grads, Tensors exp_avg_codes, Tensors exp_avg_scales,
                   Tensors exp_avg_sq_codes, Tensors exp_avg_sq_scales, Tensors outs, Tensors steps,
                   double lr, double beta1, double beta2, double eps, double weight_decay, bool adamw,
                   bool bias_correction, double grad_scale, int64_t num_threads, Text isa, Text label,
                   int64_t round_seed) {
  const auto isa_v = isa_arg(isa);
  auto rows = adam8bit_rows(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs,
                            steps, label);
  release_lists(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales, outs, steps);
  run_adam8bit(rows, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, grad_scale, num_threads, isa_v,
               round_seed);
}

// Columns of an 8-bit Adam work table (cpu_optim_table.h): the addresses of param, grad, both moments' codes and
// scales, the 16-bit output and the step; numel and the dtype codes; the references of those eight tensors.
enum Adam8bitCol : int64_t {
  kQP, kQG, kQMC, kQMS, kQVC, kQVS, kQOut, kQStep, kQNumel, kQGd, kQOd, kQPd, kQHeld, kQCols = kQHeld + 8
};

void adam8bit_table_fill(const OwnedTensor& table, Tensors params, Tensors grads, Tensors exp_avg_codes,
                         Tensors exp_avg_scales, Tensors exp_avg_sq_codes, Tensors exp_avg_sq_scales, Tensors outs,
                         Tensors steps, Text label) {
  int64_t* d = table_data(table, int64_t(params.size()), kQCols, "cpu_adam8bit_table_fill_");
  const auto rows = adam8bit_rows(params, grads, exp_avg_codes, exp_avg_scales, exp_avg_sq_codes, exp_avg_sq_scales,
                                  outs, steps, label);   // checks all first
  for (size_t i = 0; i < rows.size(); ++i, d += kQCols) {
    const auto& t = rows[i].t;
    d[kQP] = addr(t.param), d[kQG] = addr(t.grad), d[kQMC] = addr(t.exp_avg_codes), d[kQMS] = addr(t.exp_avg_scales);
    d[kQVC] = addr(t.exp_avg_sq_codes), d[kQVS] = addr(t.exp_avg_sq_scales), d[kQOut] = addr(t.out16);
    d[kQStep] = addr(rows[i].step), d[kQNumel] = t.numel;
    d[kQGd] = int64_t(t.grad_dtype), d[kQOd] = int64_t(t.out_dtype), d[kQPd] = int64_t(t.param_dtype);
    const Tensor p = params[i], g = grads[i], mc = exp_avg_codes[i], ms = exp_avg_scales[i];
    const Tensor vc = exp_avg_sq_codes[i], vs = exp_avg_sq_scales[i], st = steps[i];
    const Tensor o = outs.empty() ? p : outs[i];
    hold_row(d, kQHeld, {&p, &g, &mc, &ms, &vc, &vs, t.out16 ? &o : nullptr, &st});
  }
}

void adam8bit_table_step(const OwnedTensor& table, double lr, double beta1, double beta2, double eps,
                         double weight_decay, bool adamw, bool bias_correction, double grad_scale,
                         int64_t num_threads, Text isa, int64_t round_seed) {
  const char* op = "cpu_adam8bit_table_";
  const int64_t* d = table_data(table, -1, kQCols, op);
  const auto isa_v = isa_arg(isa);
  static constexpr int64_t kCols[] = {kQP, kQG, kQMC, kQMS, kQVC, kQVS, kQOut, kQStep};
  std::vector<Adam8bitRow> rows(size_t(table.size(0)));
  if (!all_rows(int64_t(rows.size()), num_threads, [&](int64_t i) {
        const int64_t* r = d + i * kQCols;
        const int64_t numel = r[kQNumel], blocks = (numel + dsfast::cpu::kQuantBlock - 1) / dsfast::cpu::kQuantBlock;
        return row_current(r, kCols, 8, kQHeld, [&](int64_t col) {
          return col == kQStep ? 1 : (col == kQMS || col == kQVS) ? blocks : numel;
        });
      }))
    stale(op);
  for (size_t i = 0; i < rows.size(); ++i, d += kQCols) {
    auto& t = rows[i].t;
    t.param = ptr<void>(d[kQP]);
    t.grad = ptr<const void>(d[kQG]);
    t.exp_avg_codes = ptr<uint8_t>(d[kQMC]);
    t.exp_avg_scales = ptr<float>(d[kQMS]);
    t.exp_avg_sq_codes = ptr<uint8_t>(d[kQVC]);
    t.exp_avg_sq_scales = ptr<float>(d[kQVS]);
    t.out16 = ptr<void>(d[kQOut]);
    t.numel = d[kQNumel];
    t.grad_dtype = dtype_code(d[kQGd], false, ptr<void>(d[kQG]), op, int64_t(i));
    t.out_dtype = dtype_code(d[kQOd], true, t.out16, op, int64_t(i));
    t.param_dtype = float_code(d[kQPd], op, int64_t(i));
    rows[i].step = ptr<float>(d[kQStep]);
  }
  run_adam8bit(rows, lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, grad_scale, num_threads, isa_v,
               round_seed);
}

}  // namespace

DSFAST_LIBRARY(m) {
  m.def("cpu_adam8bit_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avg_codes, "
        "Tensor(c!)[] exp_avg_scales, Tensor(d!)[] exp_avg_sq_codes, Tensor(e!)[] exp_avg_sq_scales, "
        "Tensor(f!)[] outs, Tensor(g!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "bool adamw, bool bias_correction, float grad_scale=1.0, "
        "int num_threads=0, str isa=\"auto\", str label=\"params\", int round_seed=0) -> ()");
  // Work tables (cpu_optim_table.h), as cpu_adam_table_fill_ / cpu_adam_table_
  m.def("cpu_adam8bit_table_fill_(Tensor(a!) table, Tensor[] params, Tensor[] grads, Tensor[] exp_avg_codes, "
        "Tensor[] exp_avg_scales, Tensor[] exp_avg_sq_codes, Tensor[] exp_avg_sq_scales, Tensor[] outs, "
        "Tensor[] steps, str label=\"params\") -> ()");
  m.def("cpu_adam8bit_table_(Tensor(a!) table, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "bool adamw, bool bias_correction, float grad_scale=1.0, int num_threads=0, str isa=\"auto\", "
        "int round_seed=0) -> ()");
}

DSFAST_LIBRARY_IMPL(CPU, m) {
  m.impl("cpu_adam8bit_step", DSFAST_KERNEL(adam8bit_step));
  m.impl("cpu_adam8bit_table_fill_", DSFAST_KERNEL(adam8bit_table_fill));
  m.impl("cpu_adam8bit_table_", DSFAST_KERNEL(adam8bit_table_step));
}
