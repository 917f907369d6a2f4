// L2 norms of many tensors, deterministic (fixed reduction order, no float atomics):
//   1. one block per chunk writes its sum of squares to partials[global chunk];
//   2. one warp per tensor sums its chunks' partials in order;
//   3. one block sums the tensors, then writes the total (and per-tensor) norms, the
//      overflow flag and the clip coefficient, all in device memory.
#include <vector>

#include "dtypes.cuh"
#include "multi_tensor_apply.cuh"

namespace dsfast {
namespace cuda {
namespace {

struct Workspace {
  float* partials;       // one per chunk
  double* tensor_sq;     // one per tensor
  int64_t* prefix;       // ntensors + 1 chunk offsets
};

size_t align8(size_t n) { return (n + 7) / 8 * 8; }

int64_t count_chunks(int64_t ntensors, const int64_t* numel) {
  int64_t total = 0;
  for (int64_t t = 0; t < ntensors; ++t) total += (numel[t] + kChunkElems - 1) / kChunkElems;
  return total;
}

Workspace carve(void* base, int64_t ntensors, int64_t chunks) {
  char* p = static_cast<char*>(base);
  Workspace w;
  w.tensor_sq = reinterpret_cast<double*>(p);
  p += align8(sizeof(double) * ntensors);
  w.prefix = reinterpret_cast<int64_t*>(p);
  p += align8(sizeof(int64_t) * (ntensors + 1));
  w.partials = reinterpret_cast<float*>(p);
  (void)chunks;
  return w;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Sum over the block; the result is valid in every thread. blockDim.x must be a multiple of 32.
template <typename T>
__device__ T block_sum(T x) {
  __shared__ T warp_totals[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  x = warp_sum(x);
  __syncthreads();  // warp_totals may still be read by a previous call
  if (lane == 0) warp_totals[warp] = x;
  __syncthreads();
  T y = lane < nwarps ? warp_totals[lane] : T(0);
  return warp_sum(y);
}

struct NormArgs {
  float* partials;
};

template <typename G>
struct NormFunctor {
  static constexpr int W = VecWidth<G>::value;

  struct Body {
    const G* g;
    float acc;

    template <int V>
    __device__ __forceinline__ void step(int i) {
      float r[V];
      load<V>(r, g, i);
#pragma unroll
      for (int k = 0; k < V; ++k) acc += r[k] * r[k];
    }
  };

  __device__ void operator()(const TensorListMeta<1>& meta, const ChunkRef& r, const NormArgs& a) const {
    Body b;
    b.g = static_cast<const G*>(meta.addr[0][r.tensor]) + r.offset;
    b.acc = 0.0f;
    chunk_loop<W>(r.n, is_aligned<W>(b.g), b);
    const float s = block_sum(b.acc);
    if (threadIdx.x == 0) a.partials[meta.chunk_offset + blockIdx.x] = s;
  }
};

constexpr int kWarpsPerBlock = 8;

__global__ void per_tensor_kernel(Workspace w, int64_t ntensors) {
  const int64_t t = (int64_t)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (t >= ntensors) return;
  const int lane = threadIdx.x & 31;
  double acc = 0.0;
  for (int64_t c = w.prefix[t] + lane; c < w.prefix[t + 1]; c += 32) acc += w.partials[c];
  acc = warp_sum(acc);
  if (lane == 0) w.tensor_sq[t] = acc;
}

struct FinalArgs {
  int64_t ntensors;
  float* total;
  float* per_tensor;
  const float* inv_scale;
  float* found_inf;
  float* clip_coef;
  float max_norm;
};

__global__ void total_kernel(Workspace w, FinalArgs a) {
  const float scale = a.inv_scale != nullptr ? *a.inv_scale : 1.0f;
  double acc = 0.0;
  for (int64_t t = threadIdx.x; t < a.ntensors; t += blockDim.x) {
    acc += w.tensor_sq[t];
    if (a.per_tensor != nullptr) a.per_tensor[t] = (float)sqrt(w.tensor_sq[t]) * scale;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    const float total = (float)sqrt(acc) * scale;
    *a.total = total;
    if (a.found_inf != nullptr && !isfinite(total)) *a.found_inf = 1.0f;
    if (a.clip_coef != nullptr) *a.clip_coef = fminf(a.max_norm / (total + 1e-6f), 1.0f);
  }
}

}  // namespace

size_t l2_norm_workspace_bytes(int64_t ntensors, const int64_t* numel) {
  const int64_t chunks = count_chunks(ntensors, numel);
  return align8(sizeof(double) * ntensors) + align8(sizeof(int64_t) * (ntensors + 1)) +
         align8(sizeof(float) * (chunks > 0 ? chunks : 1));
}

void l2_norm(const L2NormParams& p, cudaStream_t stream) {
  if (p.ntensors < 0 || (p.ntensors > 0 && (p.numel == nullptr || p.tensors == nullptr)))
    throw std::invalid_argument("dsfast l2_norm: bad tensor list description");
  if (p.total == nullptr || p.workspace == nullptr)
    throw std::invalid_argument("dsfast l2_norm: total and workspace are required");
  if (p.clip_coef != nullptr && !(p.max_norm > 0.0f))
    throw std::invalid_argument("dsfast l2_norm: a clip coefficient needs max_norm > 0");
  std::vector<int64_t> prefix(p.ntensors + 1, 0);
  for (int64_t t = 0; t < p.ntensors; ++t)
    prefix[t + 1] = prefix[t] + (p.numel[t] + kChunkElems - 1) / kChunkElems;
  Workspace w = carve(p.workspace, p.ntensors, prefix[p.ntensors]);
  // Pageable source: the runtime stages it before returning, so `prefix` may go out of scope.
  check_cuda(cudaMemcpyAsync(w.prefix, prefix.data(), sizeof(int64_t) * prefix.size(),
                             cudaMemcpyHostToDevice, stream), "dsfast l2_norm prefix copy");

  TensorLists<1> lists;
  lists.ntensors = p.ntensors;
  lists.numel = p.numel;
  lists.ptrs[0] = p.tensors;
  NormArgs na{w.partials};
  dispatch_dtype(p.dtype, "dsfast l2_norm", [&](auto gt) {
    using G = typename decltype(gt)::type;
    multi_tensor_apply<1, NormFunctor<G>>(lists, na, stream, "dsfast l2_norm");
  });
  if (p.ntensors > 0) {
    const int64_t blocks = (p.ntensors + kWarpsPerBlock - 1) / kWarpsPerBlock;
    DSFAST_LAUNCH(per_tensor_kernel, (unsigned)blocks, kWarpsPerBlock * 32, 0, stream)(w, p.ntensors);
    check_cuda(cudaGetLastError(), "dsfast l2_norm per-tensor reduction");
  }
  FinalArgs fa{p.ntensors, p.total, p.per_tensor, p.inv_scale, p.found_inf, p.clip_coef, p.max_norm};
  DSFAST_LAUNCH(total_kernel, 1, 1024, 0, stream)(w, fa);
  check_cuda(cudaGetLastError(), "dsfast l2_norm total");
}

}  // namespace cuda
}  // namespace dsfast
