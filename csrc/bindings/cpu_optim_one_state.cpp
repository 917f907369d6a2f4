// Torch operators of the CPU Adagrad and Lion kernels: the list ops (cpu_adagrad_step,
// cpu_lion_step) and the work-table ops (cpu_one_state_table_fill_, cpu_adagrad_table_,
// cpu_lion_table_); the rest of the cpu_optim op is in the other cpu_optim*.cpp files, the fake
// (meta) implementations in dsfast/ops/native/cpu_optim.py.
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_optim_checks.h"
#include "cpu_optim_table.h"

using namespace dsfast::cpu_bind;

namespace {

// Adagrad and Lion: one state per param (Adagrad's sum of squares, Lion's momentum) and a step count each,
// incremented here as cpu_optim_adam.cpp's run_adam does (neither rule reads it: it is the optimizer's state,
// as torch's and DeepSpeed's).
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
// cpu_optim_adam.cpp's adam_table_step does: every row checked current first, else a kStale error and
// nothing written.
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

}  // namespace

DSFAST_LIBRARY(m) {
  m.def("cpu_adagrad_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] state_sums, Tensor(c!)[] outs, "
        "Tensor(d!)[] steps, float lr, float eps, float weight_decay, float grad_scale=1.0, int num_threads=0, "
        "str isa=\"auto\", str label=\"params\", int round_seed=0) -> ()");
  m.def("cpu_lion_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] outs, "
        "Tensor(d!)[] steps, float lr, float beta1, float beta2, float weight_decay, float grad_scale=1.0, "
        "int num_threads=0, str isa=\"auto\", str label=\"params\", int round_seed=0) -> ()");
  m.def("cpu_one_state_table_fill_(Tensor(a!) table, Tensor[] params, Tensor[] grads, Tensor[] states, "
        "Tensor[] outs, Tensor[] steps, str state_key=\"state\", str label=\"params\") -> ()");
  m.def("cpu_adagrad_table_(Tensor(a!) table, float lr, float eps, float weight_decay, float grad_scale=1.0, "
        "int num_threads=0, str isa=\"auto\", int round_seed=0) -> ()");
  m.def("cpu_lion_table_(Tensor(a!) table, float lr, float beta1, float beta2, float weight_decay, "
        "float grad_scale=1.0, int num_threads=0, str isa=\"auto\", int round_seed=0) -> ()");
}

DSFAST_LIBRARY_IMPL(CPU, m) {
  m.impl("cpu_adagrad_step", DSFAST_KERNEL(adagrad_step));
  m.impl("cpu_lion_step", DSFAST_KERNEL(lion_step));
  m.impl("cpu_one_state_table_fill_", DSFAST_KERNEL(one_state_table_fill));
  m.impl("cpu_adagrad_table_", DSFAST_KERNEL(adagrad_table_step));
  m.impl("cpu_lion_table_", DSFAST_KERNEL(lion_table_step));
}
