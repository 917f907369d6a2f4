// Element types the kernels read and write, and W-wide loads/stores that convert to and
// from fp32 registers (all math runs in fp32; 16-bit values round to nearest even on store).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dsfast_cuda.h"

namespace dsfast {
namespace cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

// Element i of p is aligned to W elements whenever the caller uses the vector path.
template <int W, typename T>
__device__ __forceinline__ void load(float (&r)[W], const T* p, int i) {
  Pack<T, W> pk = *reinterpret_cast<const Pack<T, W>*>(p + i);
#pragma unroll
  for (int k = 0; k < W; ++k) r[k] = to_float(pk.v[k]);
}

template <int W, typename T>
__device__ __forceinline__ void store(T* p, int i, const float (&r)[W]) {
  Pack<T, W> pk;
#pragma unroll
  for (int k = 0; k < W; ++k) pk.v[k] = from_float<T>(r[k]);
  *reinterpret_cast<Pack<T, W>*>(p + i) = pk;
}

template <int W, typename T>
__device__ __forceinline__ bool is_aligned(const T* p) {
  return (reinterpret_cast<uintptr_t>(p) % (sizeof(T) * W)) == 0;
}

// Elements per 16-byte access of the widest type a kernel touches.
template <typename... Ts>
struct VecWidth {
  static constexpr int max_size(int a, int b) { return a > b ? a : b; }
  template <typename T, typename... Rest>
  static constexpr int widest() {
    if constexpr (sizeof...(Rest) == 0) return (int)sizeof(T);
    else return max_size((int)sizeof(T), widest<Rest...>());
  }
  static constexpr int value = 16 / widest<Ts...>();
};

template <DType D> struct CType;
template <> struct CType<DType::kFloat32> { using type = float; };
template <> struct CType<DType::kFloat16> { using type = __half; };
template <> struct CType<DType::kBFloat16> { using type = __nv_bfloat16; };

// Calls f(TypeTag<T>{}) with the C type for a runtime dtype.
template <typename T> struct TypeTag { using type = T; };

template <typename F>
void dispatch_dtype(DType d, const char* what, F&& f) {
  switch (d) {
    case DType::kFloat32: f(TypeTag<float>{}); return;
    case DType::kFloat16: f(TypeTag<__half>{}); return;
    case DType::kBFloat16: f(TypeTag<__nv_bfloat16>{}); return;
  }
  throw std::invalid_argument(std::string(what) + ": unsupported dtype");
}

template <typename F>
void dispatch_half(DType d, const char* what, F&& f) {
  switch (d) {
    case DType::kFloat16: f(TypeTag<__half>{}); return;
    case DType::kBFloat16: f(TypeTag<__nv_bfloat16>{}); return;
    default: break;
  }
  throw std::invalid_argument(std::string(what) + ": the model copy must be float16 or bfloat16");
}

}  // namespace cuda
}  // namespace dsfast
