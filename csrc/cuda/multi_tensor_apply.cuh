// One launcher for every multi-tensor kernel: many tensors per launch, each cut into
// fixed-size chunks, one thread block per chunk.
//
// The host packs tensor addresses, sizes and a running chunk count into a struct that is
// passed by value as the kernel parameter (no host->device copy, no sync). Each block finds
// its tensor by binary search over the chunk prefix, so a launch holds any number of chunks:
// a 1B-element tensor is one launch of ~15k blocks, with no per-block table to fill.
// Chunk offsets are 64-bit, so tensors with 2^31 or more elements index correctly.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dtypes.cuh"
#include "launch.cuh"

namespace dsfast {
namespace cuda {

constexpr int kBlockThreads = 512;
constexpr int kChunkElems = 65536;  // a multiple of every vector width

// CUDA 12.1+ on Volta and newer accepts up to 32764 bytes of kernel parameters; more tensors
// per launch means fewer launches for models with thousands of small tensors.
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12010 && !defined(DSFAST_MTA_SMALL_PARAMS)
constexpr int kParamBytes = 16384;
#else
constexpr int kParamBytes = 4096;
#endif
constexpr int kArgsReserve = 256;  // left for the functor's own arguments

template <int Depth>
struct TensorListMeta {
  static constexpr int kMaxTensors = (kParamBytes - kArgsReserve - 32) / (Depth * 8 + 8 + 4);
  void* addr[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t chunk_start[kMaxTensors + 1];  // prefix of chunk counts inside this launch
  int32_t ntensors;
  int64_t chunk_offset;         // global index of this launch's chunk 0 (for per-chunk outputs)
};

// Host-side description of `Depth` parallel tensor lists of `ntensors` tensors each.
// ptrs[d][t] is list d's tensor t; every list's tensor t has numel[t] elements, except
// lists a functor treats as per-tensor scalars (e.g. Adam's step counts).
template <int Depth>
struct TensorLists {
  int64_t ntensors = 0;
  void* const* ptrs[Depth] = {};
  const int64_t* numel = nullptr;
};

struct ChunkRef {
  int tensor;       // index into the launch's metadata
  int64_t offset;   // first element of the chunk inside its tensor
  int n;            // elements in this chunk (1..kChunkElems)
};

// Block b of a launch -> its tensor and chunk. Host-callable so the plan is tested on a CPU.
template <int Depth>
__host__ __device__ __forceinline__ ChunkRef locate_chunk(const TensorListMeta<Depth>& m, int b) {
  int lo = 0, hi = m.ntensors - 1;
  while (lo < hi) {  // last tensor whose first chunk is <= b (empty tensors are never packed)
    int mid = (lo + hi + 1) >> 1;
    if (m.chunk_start[mid] <= b) lo = mid; else hi = mid - 1;
  }
  ChunkRef r;
  r.tensor = lo;
  r.offset = (int64_t)(b - m.chunk_start[lo]) * kChunkElems;
  int64_t left = m.numel[lo] - r.offset;
  r.n = left < kChunkElems ? (int)left : kChunkElems;
  return r;
}

template <int Depth, typename Functor, typename Args>
__global__ void __launch_bounds__(kBlockThreads)
multi_tensor_kernel(const __grid_constant__ TensorListMeta<Depth> meta, const __grid_constant__ Args args) {
  const ChunkRef c = locate_chunk(meta, blockIdx.x);
  Functor()(meta, c, args);
}

inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("dsfast CUDA: ") + what + " failed: " + cudaGetErrorString(err));
}

// Pack every non-empty tensor into launches and call launch(meta, blocks) for each; one block
// per chunk. Throws std::invalid_argument on bad arguments (the message names the op).
template <int Depth, typename Launch>
void plan_launches(const TensorLists<Depth>& lists, const char* op_name, Launch&& launch) {
  using Meta = TensorListMeta<Depth>;
  if (lists.ntensors < 0 || (lists.ntensors > 0 && lists.numel == nullptr))
    throw std::invalid_argument(std::string(op_name) + ": bad tensor list description");
  for (int d = 0; d < Depth; ++d)
    if (lists.ntensors > 0 && lists.ptrs[d] == nullptr)
      throw std::invalid_argument(std::string(op_name) + ": tensor list " + std::to_string(d) + " is missing");

  Meta meta;
  meta.ntensors = 0;
  meta.chunk_start[0] = 0;
  meta.chunk_offset = 0;
  int64_t global_chunks = 0;

  auto flush = [&]() {
    if (meta.ntensors > 0) {
      const int blocks = meta.chunk_start[meta.ntensors];
      launch(static_cast<const Meta&>(meta), blocks);
      global_chunks += blocks;
    }
    meta.ntensors = 0;
    meta.chunk_offset = global_chunks;
  };

  for (int64_t t = 0; t < lists.ntensors; ++t) {
    const int64_t n = lists.numel[t];
    if (n < 0) throw std::invalid_argument(std::string(op_name) + ": negative element count");
    if (n == 0) continue;
    const int64_t chunks = (n + kChunkElems - 1) / kChunkElems;
    if (chunks > INT32_MAX / 2)
      throw std::invalid_argument(std::string(op_name) + ": tensor " + std::to_string(t) + " is too large");
    if (meta.ntensors == Meta::kMaxTensors || (int64_t)meta.chunk_start[meta.ntensors] + chunks > INT32_MAX)
      flush();
    const int i = meta.ntensors;
    for (int d = 0; d < Depth; ++d) {
      if (lists.ptrs[d][t] == nullptr)
        throw std::invalid_argument(std::string(op_name) + ": null pointer in list " + std::to_string(d) +
                                    " at tensor " + std::to_string(t));
      meta.addr[d][i] = lists.ptrs[d][t];
    }
    meta.numel[i] = n;
    meta.chunk_start[i + 1] = meta.chunk_start[i] + (int32_t)chunks;
    meta.ntensors = i + 1;
  }
  flush();
}

// Launch Functor over every chunk of every non-empty tensor. Throws std::invalid_argument on
// bad arguments and std::runtime_error when a launch fails (the message names the op).
template <int Depth, typename Functor, typename Args>
void multi_tensor_apply(const TensorLists<Depth>& lists, const Args& args, cudaStream_t stream,
                        const char* op_name) {
  using Meta = TensorListMeta<Depth>;
  static_assert(sizeof(Meta) + sizeof(Args) <= kParamBytes, "kernel parameters exceed the limit");
  plan_launches(lists, op_name, [&](const Meta& meta, int blocks) {
    DSFAST_LAUNCH((multi_tensor_kernel<Depth, Functor, Args>), blocks, kBlockThreads, 0, stream)(meta, args);
    check_cuda(cudaGetLastError(), op_name);
  });
}

// Walk the `n` elements of a chunk: W-wide vector steps over the aligned body when every
// pointer allows it, then a masked scalar tail (or a scalar walk when misaligned).
// Body must provide `template <int W> void step(int i)`. Thread `tid` of `nthreads`; the
// host-callable form lets a CPU test check that every element is visited exactly once.
#pragma nv_exec_check_disable
template <int W, typename Body>
__host__ __device__ __forceinline__ void chunk_loop(int n, bool aligned, int tid, int nthreads, Body& body) {
  int start = 0;
  if (aligned) {
    const int nv = n - n % W;
    for (int i = tid * W; i < nv; i += nthreads * W) body.template step<W>(i);
    start = nv;
  }
  for (int i = start + tid; i < n; i += nthreads) body.template step<1>(i);
}

template <int W, typename Body>
__device__ __forceinline__ void chunk_loop(int n, bool aligned, Body& body) {
  chunk_loop<W>(n, aligned, (int)threadIdx.x, (int)blockDim.x, body);
}

}  // namespace cuda
}  // namespace dsfast
