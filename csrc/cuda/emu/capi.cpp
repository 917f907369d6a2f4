// A C ABI over dsfast::cuda's host API (csrc/cuda/dsfast_cuda.h), compiled with the emulated
// kernels into one shared library that tests/_cuda_emu.py loads with ctypes. Each call returns
// nullptr, or the error message (valid until the next call on this thread).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuemu.h"
#include "dsfast_cuda.h"

namespace dc = dsfast::cuda;

namespace {
thread_local std::string last_error;

template <typename F>
const char* guarded(F&& f) {
  try {
    f();
    return nullptr;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown error";
  }
  return last_error.c_str();
}

dc::AmpScalars amp(const float* inv_scale, const float* clip_coef, const float* found_inf) {
  dc::AmpScalars a;
  a.inv_scale = inv_scale;
  a.clip_coef = clip_coef;
  a.found_inf = found_inf;
  return a;
}
}  // namespace

extern "C" {

void dsfast_emu_set_order(int order, uint64_t seed) { cuemu::set_order(static_cast<cuemu::Order>(order), seed); }
void dsfast_emu_set_workers(int workers) { cuemu::set_workers(workers); }

// "kernel threads" lines: each kernel launched so far and the most threads per block it was given.
const char* dsfast_emu_launch_sizes() {
  last_error = cuemu::launch_sizes();
  return last_error.c_str();
}

const char* dsfast_emu_adam(int64_t n, const int64_t* numel, void* const* grads, int grad_dtype, void* const* params,
                            int param_dtype, void* const* exp_avgs, void* const* exp_avg_sqs, float* const* steps,
                            void* const* model_copies, int model_dtype, double lr, double beta1, double beta2,
                            double eps, double weight_decay, int adamw, int bias_correction, int maximize,
                            const float* inv_scale, const float* clip_coef, const float* found_inf) {
  return guarded([&] {
    dc::AdamParams p;
    p.ntensors = n;
    p.numel = numel;
    p.grads = grads;
    p.grad_dtype = static_cast<dc::DType>(grad_dtype);
    p.params = params;
    p.param_dtype = static_cast<dc::DType>(param_dtype);
    p.exp_avgs = exp_avgs;
    p.exp_avg_sqs = exp_avg_sqs;
    p.steps = steps;
    p.model_copies = model_copies;
    p.model_dtype = static_cast<dc::DType>(model_dtype);
    p.lr = lr;
    p.beta1 = beta1;
    p.beta2 = beta2;
    p.eps = eps;
    p.weight_decay = weight_decay;
    p.adamw = adamw != 0;
    p.bias_correction = bias_correction != 0;
    p.maximize = maximize != 0;
    p.amp = amp(inv_scale, clip_coef, found_inf);
    dc::adam(p, nullptr);
  });
}

const char* dsfast_emu_sgd(int64_t n, const int64_t* numel, void* const* grads, int grad_dtype, void* const* params,
                           int param_dtype, void* const* momentum_buffers, void* const* model_copies, int model_dtype,
                           double lr, double momentum, double dampening, double weight_decay, int nesterov,
                           int first_step, int maximize, const float* inv_scale, const float* clip_coef,
                           const float* found_inf) {
  return guarded([&] {
    dc::SGDParams p;
    p.ntensors = n;
    p.numel = numel;
    p.grads = grads;
    p.grad_dtype = static_cast<dc::DType>(grad_dtype);
    p.params = params;
    p.param_dtype = static_cast<dc::DType>(param_dtype);
    p.momentum_buffers = momentum_buffers;
    p.model_copies = model_copies;
    p.model_dtype = static_cast<dc::DType>(model_dtype);
    p.lr = lr;
    p.momentum = momentum;
    p.dampening = dampening;
    p.weight_decay = weight_decay;
    p.nesterov = nesterov != 0;
    p.first_step = first_step != 0;
    p.maximize = maximize != 0;
    p.amp = amp(inv_scale, clip_coef, found_inf);
    dc::sgd(p, nullptr);
  });
}

const char* dsfast_emu_unscale_and_check(int64_t n, const int64_t* numel, void* const* grads, int dtype,
                                         const float* inv_scale, float* found_inf) {
  return guarded([&] {
    dc::UnscaleParams p;
    p.ntensors = n;
    p.numel = numel;
    p.grads = grads;
    p.dtype = static_cast<dc::DType>(dtype);
    p.inv_scale = inv_scale;
    p.found_inf = found_inf;
    dc::unscale_and_check(p, nullptr);
  });
}

const char* dsfast_emu_l2_norm(int64_t n, const int64_t* numel, void* const* tensors, int dtype, float* total,
                               float* per_tensor, const float* inv_scale, float* found_inf, float* clip_coef,
                               float max_norm) {
  return guarded([&] {
    // Workspace as the binding allocates it, filled with a pattern so stale reads show.
    std::vector<double> ws((dc::l2_norm_workspace_bytes(n, numel) + 7) / 8, -1.0e30);
    dc::L2NormParams p;
    p.ntensors = n;
    p.numel = numel;
    p.tensors = tensors;
    p.dtype = static_cast<dc::DType>(dtype);
    p.workspace = ws.data();
    p.total = total;
    p.per_tensor = per_tensor;
    p.inv_scale = inv_scale;
    p.found_inf = found_inf;
    p.clip_coef = clip_coef;
    p.max_norm = max_norm;
    dc::l2_norm(p, nullptr);
  });
}

}  // extern "C"
