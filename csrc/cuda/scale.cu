// Unscale gradients in place and raise the overflow flag, over many tensors per launch.
// The flag is only ever set to 1 by the blocks that saw a non-finite value (a benign race:
// every writer writes the same value), so callers can accumulate over several calls.
#include "dtypes.cuh"
#include "multi_tensor_apply.cuh"

namespace dsfast {
namespace cuda {
namespace {

struct UnscaleArgs {
  const float* inv_scale;
  float* found_inf;
};

template <typename G>
struct UnscaleFunctor {
  static constexpr int W = VecWidth<G>::value;

  struct Body {
    G* g;
    float inv_scale;
    bool bad;

    template <int V>
    __device__ __forceinline__ void step(int i) {
      float r[V];
      load<V>(r, g, i);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        bad |= !isfinite(r[k]);
        r[k] *= inv_scale;
      }
      store<V>(g, i, r);
    }
  };

  __device__ void operator()(const TensorListMeta<1>& meta, const ChunkRef& r, const UnscaleArgs& a) const {
    Body b;
    b.g = static_cast<G*>(meta.addr[0][r.tensor]) + r.offset;
    b.inv_scale = *a.inv_scale;
    b.bad = false;
    chunk_loop<W>(r.n, is_aligned<W>(b.g), b);
    if (__syncthreads_or(b.bad) && threadIdx.x == 0) *a.found_inf = 1.0f;
  }
};

}  // namespace

void unscale_and_check(const UnscaleParams& p, cudaStream_t stream) {
  if (p.ntensors == 0) return;
  if (p.inv_scale == nullptr || p.found_inf == nullptr)
    throw std::invalid_argument("dsfast unscale_and_check: inv_scale and found_inf are required");
  UnscaleArgs a{p.inv_scale, p.found_inf};
  TensorLists<1> lists;
  lists.ntensors = p.ntensors;
  lists.numel = p.numel;
  lists.ptrs[0] = p.grads;
  dispatch_dtype(p.dtype, "dsfast unscale_and_check", [&](auto gt) {
    using G = typename decltype(gt)::type;
    multi_tensor_apply<1, UnscaleFunctor<G>>(lists, a, stream, "dsfast unscale_and_check");
  });
}

}  // namespace cuda
}  // namespace dsfast
