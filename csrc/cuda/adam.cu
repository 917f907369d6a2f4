// Adam / AdamW over many tensors in one pass: unscale and clip the gradient on the fly,
// skip everything when the overflow flag is set, optionally write the 16-bit model copy.
// The update itself is dsfast::adam_update from the shared math header.
#include <type_traits>

#include "dsfast/optim_math.h"
#include "dtypes.cuh"
#include "multi_tensor_apply.cuh"

namespace dsfast {
namespace cuda {
namespace {

// Hyperparameters, not coefficients: the bias corrections depend on each tensor's own
// step count, so the kernel builds the coefficients per tensor (make_adam_coeffs).
struct AdamArgs {
  double lr, beta1, beta2, eps, weight_decay;
  bool adamw;
  bool bias_correction;
  bool maximize;
  AmpScalars amp;
};

// Lists: 0 grad (G), 1 param (P), 2 exp_avg (P), 3 exp_avg_sq (P), 4 step (fp32 scalar),
// 5 model copy (Model; only when Model is not void, and then P is the fp32 master).
template <typename G, typename P, typename Model>
struct AdamFunctor {
  static constexpr bool kCopy = !std::is_void<Model>::value;
  static constexpr int kDepth = kCopy ? 6 : 5;
  using Out = std::conditional_t<kCopy, Model, P>;
  static constexpr int W = VecWidth<G, P, Out>::value;

  struct Body {
    const G* g;
    P* p;
    P* m;
    P* v;
    Out* out;
    AdamCoeffs c;

    template <int V>
    __device__ __forceinline__ void step(int i) {
      float rg[V], rp[V], rm[V], rv[V];
      load<V>(rg, g, i);
      load<V>(rp, p, i);
      load<V>(rm, m, i);
      load<V>(rv, v, i);
#pragma unroll
      for (int k = 0; k < V; ++k) adam_update(rp[k], rg[k], rm[k], rv[k], c);
      store<V>(p, i, rp);
      store<V>(m, i, rm);
      store<V>(v, i, rv);
      if constexpr (kCopy) store<V>(out, i, rp);
    }
  };

  __device__ void operator()(const TensorListMeta<kDepth>& meta, const ChunkRef& r, const AdamArgs& a) const {
    if (a.amp.found_inf != nullptr && *a.amp.found_inf != 0.0f) return;
    const int t = r.tensor;
    Body b;
    // The coefficients first (pow is a call): fewer values live across it, so no spills.
    const int64_t step = a.bias_correction ? (int64_t)*static_cast<const float*>(meta.addr[4][t]) : 1;
    b.c = make_adam_coeffs(a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.adamw, a.bias_correction, step);
    b.g = static_cast<const G*>(meta.addr[0][t]) + r.offset;
    b.p = static_cast<P*>(meta.addr[1][t]) + r.offset;
    b.m = static_cast<P*>(meta.addr[2][t]) + r.offset;
    b.v = static_cast<P*>(meta.addr[3][t]) + r.offset;
    b.out = kCopy ? static_cast<Out*>(meta.addr[kDepth - 1][t]) + r.offset : nullptr;
    float scale = 1.0f;
    if (a.amp.inv_scale != nullptr) scale *= *a.amp.inv_scale;
    if (a.amp.clip_coef != nullptr) scale *= *a.amp.clip_coef;
    if (a.maximize) scale = -scale;
    b.c.grad_scale = scale;
    bool aligned = is_aligned<W>(b.g) && is_aligned<W>(b.p) && is_aligned<W>(b.m) && is_aligned<W>(b.v);
    if constexpr (kCopy) aligned = aligned && is_aligned<W>(b.out);
    chunk_loop<W>(r.n, aligned, b);
  }
};

template <typename G, typename P, typename Model>
void launch_adam(const AdamParams& p, const AdamArgs& a, cudaStream_t stream) {
  using F = AdamFunctor<G, P, Model>;
  TensorLists<F::kDepth> lists;
  lists.ntensors = p.ntensors;
  lists.numel = p.numel;
  lists.ptrs[0] = p.grads;
  lists.ptrs[1] = p.params;
  lists.ptrs[2] = p.exp_avgs;
  lists.ptrs[3] = p.exp_avg_sqs;
  lists.ptrs[4] = reinterpret_cast<void* const*>(p.steps);
  if constexpr (F::kCopy) lists.ptrs[5] = p.model_copies;
  multi_tensor_apply<F::kDepth, F>(lists, a, stream, "dsfast adam");
}

}  // namespace

void adam(const AdamParams& p, cudaStream_t stream) {
  if (p.ntensors == 0) return;
  if (p.steps == nullptr) throw std::invalid_argument("dsfast adam: step counts are required");
  AdamArgs a;
  a.lr = p.lr;
  a.beta1 = p.beta1;
  a.beta2 = p.beta2;
  a.eps = p.eps;
  a.weight_decay = p.weight_decay;
  a.adamw = p.adamw;
  a.bias_correction = p.bias_correction;
  a.amp = p.amp;
  a.maximize = p.maximize;
  dispatch_dtype(p.grad_dtype, "dsfast adam grads", [&](auto gt) {
    using G = typename decltype(gt)::type;
    if (p.model_copies != nullptr) {
      if (p.param_dtype != DType::kFloat32)
        throw std::invalid_argument("dsfast adam: with a model copy the params must be fp32 master weights");
      dispatch_half(p.model_dtype, "dsfast adam", [&](auto mt) {
        launch_adam<G, float, typename decltype(mt)::type>(p, a, stream);
      });
    } else {
      dispatch_dtype(p.param_dtype, "dsfast adam params", [&](auto pt) {
        launch_adam<G, typename decltype(pt)::type, void>(p, a, stream);
      });
    }
  });
}

}  // namespace cuda
}  // namespace dsfast
