// Torch operator of the CPU Adam / AdamW kernel with 8-bit block-wise moments (cpu_adam8bit_step);
// the rest of the cpu_optim op is in the other cpu_optim*.cpp files, the fake (meta)
// implementation in dsfast/ops/native/cpu_optim.py.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cpu_optim_checks.h"

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

}  // namespace

DSFAST_LIBRARY(m) {
  m.def("cpu_adam8bit_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avg_codes, "
        "Tensor(c!)[] exp_avg_scales, Tensor(d!)[] exp_avg_sq_codes, Tensor(e!)[] exp_avg_sq_scales, "
        "Tensor(f!)[] outs, Tensor(g!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, "
        "bool adamw, bool bias_correction, float grad_scale=1.0, "
        "int num_threads=0, str isa=\"auto\", str label=\"params\", int round_seed=0) -> ()");
}

DSFAST_LIBRARY_IMPL(CPU, m) {
  m.impl("cpu_adam8bit_step", DSFAST_KERNEL(adam8bit_step));
}
