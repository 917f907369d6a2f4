// Host API of dsfast's CUDA kernels: plain pointers and sizes, no torch. The torch binding
// (csrc/bindings/cuda_optim.cpp) checks tensors and calls these; anything else may too.
//
// Every entry point is asynchronous on `stream` and never reads device memory back to the
// host. Device scalars (inverse loss scale, clip coefficient, overflow flag) are read inside
// the kernels. Bad arguments throw std::invalid_argument; launch failures std::runtime_error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace dsfast {
namespace cuda {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Mixed-precision scalars in device memory; each may be null (= off).
struct AmpScalars {
  const float* inv_scale = nullptr;  // gradients are multiplied by *inv_scale ...
  const float* clip_coef = nullptr;  // ... and by *clip_coef before the update
  const float* found_inf = nullptr;  // when *found_inf != 0 nothing is written at all
};

// Adam / AdamW over `ntensors` tensors. Without model_copies, params/exp_avgs/exp_avg_sqs
// share param_dtype (torch's layout). With model_copies, params are fp32 master weights with
// fp32 moments and the updated value is also written, rounded, to the 16-bit model copy.
struct AdamParams {
  int64_t ntensors = 0;
  const int64_t* numel = nullptr;
  void* const* grads = nullptr;
  DType grad_dtype = DType::kFloat32;
  void* const* params = nullptr;
  DType param_dtype = DType::kFloat32;
  void* const* exp_avgs = nullptr;
  void* const* exp_avg_sqs = nullptr;
  float* const* steps = nullptr;           // fp32 step counts per tensor, already incremented
  void* const* model_copies = nullptr;     // optional
  DType model_dtype = DType::kBFloat16;
  // double, as torch passes them: 1 - beta and lr * wd are formed before rounding to float
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool adamw = true;
  bool bias_correction = true;
  bool maximize = false;    // ascend: the gradient's sign is flipped
  AmpScalars amp;
};
void adam(const AdamParams& p, cudaStream_t stream);

// SGD with torch.optim.SGD semantics. momentum_buffers may be null when momentum == 0;
// otherwise they share the params' dtype (fp32 when model_copies are given).
struct SGDParams {
  int64_t ntensors = 0;
  const int64_t* numel = nullptr;
  void* const* grads = nullptr;
  DType grad_dtype = DType::kFloat32;
  void* const* params = nullptr;
  DType param_dtype = DType::kFloat32;
  void* const* momentum_buffers = nullptr;
  void* const* model_copies = nullptr;
  DType model_dtype = DType::kBFloat16;
  double lr = 1e-3, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = false;  // seed the buffers with the gradient (torch's first step)
  bool maximize = false;
  AmpScalars amp;
};
void sgd(const SGDParams& p, cudaStream_t stream);

// grads *= *inv_scale in place; *found_inf = 1 when any gradient is inf or nan.
struct UnscaleParams {
  int64_t ntensors = 0;
  const int64_t* numel = nullptr;
  void* const* grads = nullptr;
  DType dtype = DType::kFloat32;
  const float* inv_scale = nullptr;  // required
  float* found_inf = nullptr;        // required; only ever set to 1, never cleared
};
void unscale_and_check(const UnscaleParams& p, cudaStream_t stream);

// L2 norms of many tensors (fp32 accumulation, deterministic: no float atomics).
// total = sqrt(sum of squares of all tensors) * (inv_scale ? *inv_scale : 1).
// Optionally: per-tensor norms, found_inf set when the total is not finite, and the
// clip coefficient min(1, max_norm / (total + 1e-6)) as torch.nn.utils.clip_grad_norm_.
struct L2NormParams {
  int64_t ntensors = 0;
  const int64_t* numel = nullptr;
  void* const* tensors = nullptr;
  DType dtype = DType::kFloat32;
  void* workspace = nullptr;          // l2_norm_workspace_bytes() bytes of device memory
  float* total = nullptr;             // required: one float
  float* per_tensor = nullptr;        // optional: ntensors floats
  const float* inv_scale = nullptr;   // optional
  float* found_inf = nullptr;         // optional
  float* clip_coef = nullptr;         // optional: needs max_norm > 0
  float max_norm = 0.0f;
};
size_t l2_norm_workspace_bytes(int64_t ntensors, const int64_t* numel);
void l2_norm(const L2NormParams& p, cudaStream_t stream);

}  // namespace cuda
}  // namespace dsfast
