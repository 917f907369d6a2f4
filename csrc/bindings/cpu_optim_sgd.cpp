// Torch operators of the CPU SGD kernel: the list op (cpu_sgd_step) and the work-table ops
// (cpu_sgd_table_fill_, cpu_sgd_table_); the rest of the cpu_optim op is in the other
// cpu_optim*.cpp files, the fake (meta) implementations in dsfast/ops/native/cpu_optim.py.
#include <cstdint>
#include <string>
#include <vector>

#include "cpu_optim_checks.h"
#include "cpu_optim_table.h"

using namespace dsfast::cpu_bind;

namespace {

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

// Columns of an SGD work table (see cpu_optim_table.h).
enum SgdCol : int64_t { kSP, kSG, kSBuf, kSOut, kSNumel, kSGd, kSOd, kSPd, kSSd, kSHeld, kSgdCols = kSHeld + 4 };

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

}  // namespace

DSFAST_LIBRARY(m) {
  m.def("cpu_sgd_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, Tensor(c!)[] outs, "
        "bool[] first_steps, float lr, float momentum, float dampening, float weight_decay, bool nesterov, "
        "float grad_scale=1.0, int num_threads=0, str isa=\"auto\", str label=\"params\", int round_seed=0) -> ()");
  m.def("cpu_sgd_table_fill_(Tensor(a!) table, Tensor[] params, Tensor[] grads, Tensor[] momentum_buffers, "
        "Tensor[] outs, str label=\"params\") -> ()");
  m.def("cpu_sgd_table_(Tensor(a!) table, float lr, float momentum, float dampening, float weight_decay, "
        "bool nesterov, float grad_scale=1.0, int num_threads=0, str isa=\"auto\", int round_seed=0) -> ()");
}

DSFAST_LIBRARY_IMPL(CPU, m) {
  m.impl("cpu_sgd_step", DSFAST_KERNEL(sgd_step));
  m.impl("cpu_sgd_table_fill_", DSFAST_KERNEL(sgd_table_fill));
  m.impl("cpu_sgd_table_", DSFAST_KERNEL(sgd_table_step));
}
