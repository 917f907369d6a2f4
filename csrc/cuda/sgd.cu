// SGD (momentum, dampening, nesterov, weight decay) over many tensors in one pass, with the
// same on-the-fly unscale/clip/skip as Adam. The update is dsfast::sgd_update.
#include <type_traits>

#include "dsfast/optim_math.h"
#include "dtypes.cuh"
#include "multi_tensor_apply.cuh"

namespace dsfast {
namespace cuda {
namespace {

struct SGDArgs {
  SGDCoeffs coeffs;
  bool has_buffers;  // momentum != 0
  bool maximize;
  AmpScalars amp;
};

// Lists: 0 grad (G), 1 param (P), 2 momentum buffer (P; unused without momentum),
// 3 model copy (Model; only when Model is not void, and then P is the fp32 master).
template <typename G, typename P, typename Model>
struct SGDFunctor {
  static constexpr bool kCopy = !std::is_void<Model>::value;
  static constexpr int kDepth = kCopy ? 4 : 3;
  using Out = std::conditional_t<kCopy, Model, P>;
  static constexpr int W = VecWidth<G, P, Out>::value;

  struct Body {
    const G* g;
    P* p;
    P* buf;
    Out* out;
    bool has_buf;
    SGDCoeffs c;

    template <int V>
    __device__ __forceinline__ void step(int i) {
      float rg[V], rp[V], rb[V];
      load<V>(rg, g, i);
      load<V>(rp, p, i);
      if (has_buf && !c.first_step) {
        load<V>(rb, buf, i);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) rb[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) sgd_update(rp[k], rg[k], rb[k], c);
      store<V>(p, i, rp);
      if (has_buf) store<V>(buf, i, rb);
      if constexpr (kCopy) store<V>(out, i, rp);
    }
  };

  __device__ void operator()(const TensorListMeta<kDepth>& meta, const ChunkRef& r, const SGDArgs& a) const {
    if (a.amp.found_inf != nullptr && *a.amp.found_inf != 0.0f) return;
    const int t = r.tensor;
    Body b;
    b.g = static_cast<const G*>(meta.addr[0][t]) + r.offset;
    b.p = static_cast<P*>(meta.addr[1][t]) + r.offset;
    b.buf = static_cast<P*>(meta.addr[2][t]) + r.offset;
    b.out = kCopy ? static_cast<Out*>(meta.addr[kDepth - 1][t]) + r.offset : nullptr;
    b.has_buf = a.has_buffers;
    b.c = a.coeffs;
    float scale = 1.0f;
    if (a.amp.inv_scale != nullptr) scale *= *a.amp.inv_scale;
    if (a.amp.clip_coef != nullptr) scale *= *a.amp.clip_coef;
    if (a.maximize) scale = -scale;
    b.c.grad_scale = scale;
    bool aligned = is_aligned<W>(b.g) && is_aligned<W>(b.p);
    if (b.has_buf) aligned = aligned && is_aligned<W>(b.buf);
    if constexpr (kCopy) aligned = aligned && is_aligned<W>(b.out);
    chunk_loop<W>(r.n, aligned, b);
  }
};

template <typename G, typename P, typename Model>
void launch_sgd(const SGDParams& p, const SGDArgs& a, cudaStream_t stream) {
  using F = SGDFunctor<G, P, Model>;
  TensorLists<F::kDepth> lists;
  lists.ntensors = p.ntensors;
  lists.numel = p.numel;
  lists.ptrs[0] = p.grads;
  lists.ptrs[1] = p.params;
  // Without momentum the buffer list is never dereferenced; point it at the params.
  lists.ptrs[2] = a.has_buffers ? p.momentum_buffers : p.params;
  if constexpr (F::kCopy) lists.ptrs[3] = p.model_copies;
  multi_tensor_apply<F::kDepth, F>(lists, a, stream, "dsfast sgd");
}

}  // namespace

void sgd(const SGDParams& p, cudaStream_t stream) {
  if (p.ntensors == 0) return;
  SGDArgs a;
  a.coeffs = make_sgd_coeffs(p.lr, p.momentum, p.dampening, p.weight_decay, p.nesterov, p.first_step);
  a.has_buffers = p.momentum != 0.0;
  a.amp = p.amp;
  a.maximize = p.maximize;
  if (a.has_buffers && p.momentum_buffers == nullptr)
    throw std::invalid_argument("dsfast sgd: momentum != 0 needs momentum buffers");
  dispatch_dtype(p.grad_dtype, "dsfast sgd grads", [&](auto gt) {
    using G = typename decltype(gt)::type;
    if (p.model_copies != nullptr) {
      if (p.param_dtype != DType::kFloat32)
        throw std::invalid_argument("dsfast sgd: with a model copy the params must be fp32 master weights");
      dispatch_half(p.model_dtype, "dsfast sgd", [&](auto mt) {
        launch_sgd<G, float, typename decltype(mt)::type>(p, a, stream);
      });
    } else {
      dispatch_dtype(p.param_dtype, "dsfast sgd params", [&](auto pt) {
        launch_sgd<G, typename decltype(pt)::type, void>(p, a, stream);
      });
    }
  });
}

}  // namespace cuda
}  // namespace dsfast
