// Torch operators of the CPU Adam / AdamW kernels: the list op (cpu_adam_step) and the work-table
// ops (cpu_adam_table_fill_, cpu_adam_table_); the rest of the cpu_optim op is in the other
// cpu_optim*.cpp files, the fake (meta) implementations in dsfast/ops/native/cpu_optim.py.
#include <cstdint>
#include <vector>

#include "cpu_optim_checks.h"
#include "cpu_optim_table.h"

using namespace dsfast::cpu_bind;

namespace {

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

// Columns of an Adam work table (see cpu_optim_table.h).
enum AdamCol : int64_t {
  kAP, kAG, kAM, kAV, kAOut, kAStep, kANumel, kAGd, kAOd, kAPd, kASd, kAHeld, kAdamCols = kAHeld + 6
};

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

}  // namespace

DSFAST_LIBRARY(m) {
  m.def("cpu_adam_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "Tensor(d!)[] outs, Tensor(e!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "bool adamw, bool bias_correction, float grad_scale=1.0, int num_threads=0, str isa=\"auto\", "
        "str label=\"params\", int round_seed=0) -> ()");
  // Work tables (cpu_optim_table.h). The step ops write through the table's addresses; the
  // table is marked mutated so that no graph treats a step as free of side effects.
  m.def("cpu_adam_table_fill_(Tensor(a!) table, Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, "
        "Tensor[] exp_avg_sqs, Tensor[] outs, Tensor[] steps, str label=\"params\") -> ()");
  m.def("cpu_adam_table_(Tensor(a!) table, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "bool adamw, bool bias_correction, float grad_scale=1.0, int num_threads=0, str isa=\"auto\", "
        "int round_seed=0) -> ()");
}

DSFAST_LIBRARY_IMPL(CPU, m) {
  m.impl("cpu_adam_step", DSFAST_KERNEL(adam_step));
  m.impl("cpu_adam_table_fill_", DSFAST_KERNEL(adam_table_fill));
  m.impl("cpu_adam_table_", DSFAST_KERNEL(adam_table_step));
}
