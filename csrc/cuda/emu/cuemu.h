// cuemu: a CPU emulation of the CUDA execution model, for tests only. It lets g++ compile the
// unmodified csrc/cuda/*.cu sources (force-included with -include cuemu.h, with
// csrc/cuda/emu/include ahead of the toolkit's include directory) and run their kernels.
//
// Model: every CUDA thread is a fiber with its own stack, switched by a few lines of assembly
// (cuemu_fiber.cpp; cuemu_runtime.h lists the runtime's files). All threads of a block run on one
// OS thread; blocks are spread over OS threads.
// A fiber runs until it reaches a block barrier (__syncthreads*), a warp operation (__shfl*_sync,
// __ballot_sync, __any_sync, __all_sync, __syncwarp: a rendezvous of the lanes its mask names)
// or its end. Strict checks, each an error naming the file and line: a barrier or mask naming a
// thread that has exited, threads of a block (or lanes of a warp) waiting at different barriers,
// deadlock, launch configurations over the device limits, kernel parameters over 32,764 bytes.
// Thread and block order: forward, reverse or random with a seed (cuemu::set_order or the
// CUEMU_ORDER / CUEMU_SEED environment variables), so order-dependent results show.
// 16-bit types and their conversions are NVIDIA's own host code (cuda_fp16.h, cuda_bf16.h).
#pragma once

#if defined(__CUDACC__)
#error "cuemu.h is for host compilers; nvcc builds the kernels for a real GPU"
#endif

// Qualifiers, defined before the toolkit's host_defines.h (which keeps definitions it finds).
#define __global__
#define __device__
#define __host__
#define __constant__
#define __grid_constant__
#define __launch_bounds__(...)
// One block's threads all run on one OS thread, one block at a time: thread-local statics
// are exactly per-block memory.
#define __shared__ static thread_local

// The toolkit's own runtime headers stay out (their API is provided below, synchronously);
// its headers that include them by quoted name get this instead.
#define __CUDA_RUNTIME_H__
#define __CUDA_RUNTIME_API_H__

#include <driver_types.h>
#include <vector_types.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#ifndef CUDART_VERSION
#define CUDART_VERSION 13000
#endif

namespace cuemu {

// Every strict check throws this from the launch, the message starting "file:line: ".
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Order { kForward = 0, kReverse = 1, kRandom = 2 };
// Order of threads within a block and of blocks within a launch; workers = OS threads per
// launch (0 = the CPU count). Defaults come from CUEMU_ORDER, CUEMU_SEED, CUEMU_WORKERS.
void set_order(Order order, uint64_t seed);
void set_workers(int workers);
Order order();

struct Launch;
struct Block;

// One CUDA thread.
struct Thread {
  void* sp = nullptr;        // saved stack pointer while switched out
  char* stack = nullptr;     // lowest address of its stack
  size_t stack_size = 0;
  uint3 idx{};               // threadIdx
  int linear = 0;            // x + y*bx + z*bx*by
  int lane = 0, warp = 0;
  int state = 0;             // Thread::kRunnable, ...
  Block* block = nullptr;
  // where it waits (or waited last)
  const char* file = nullptr;
  int line = 0;
  // block barrier
  int predicate = 0, bar_result = 0;
  // warp operation: value in, argument, result out
  uint64_t value = 0, result = 0;
  int arg = 0, width = 32;
  enum { kRunnable = 0, kAtBarrier = 1, kAtWarpOp = 2, kExited = 3 };
};

extern thread_local Thread* current;  // the CUDA thread running on this OS thread

const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();

enum class BarKind { kPlain, kOr, kAnd, kCount };
int sync_block(const char* file, int line, BarKind kind, int predicate);

enum class WarpOp { kIdx, kUp, kDown, kXor, kBallot, kAny, kAll, kSync };
uint64_t warp_op(const char* file, int line, WarpOp op, unsigned mask, uint64_t value, int arg, int width);

template <typename T>
T shfl(const char* file, int line, WarpOp op, unsigned mask, T v, int arg, int width = 32) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffles move up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_op(file, line, op, mask, bits, arg, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// --- launches --------------------------------------------------------------------------------
struct LaunchSpec {
  const char* file;
  int line;
  const char* kernel;
  dim3 grid, block;
  size_t smem;
  size_t param_bytes;
  void (*entry)(void*);  // runs the kernel body once, in the current CUDA thread
  void* ctx;
};
void run(const LaunchSpec& spec);  // blocks until every block has finished; throws Error
// "kernel threads\n" for every kernel launched so far: the most threads per block it was given.
std::string launch_sizes();

template <typename... P>
struct Launcher {
  const char* file;
  int line;
  const char* name;
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;

  // Parameter space as the CUDA ABI lays it out: each parameter at its own alignment.
  static constexpr size_t param_bytes() {
    size_t off = 0;
    ((off = (off + alignof(std::decay_t<P>) - 1) / alignof(std::decay_t<P>) * alignof(std::decay_t<P>) +
            sizeof(std::decay_t<P>)),
     ...);
    return off;
  }

  template <typename... A>
  void operator()(A&&... a) const {
    static_assert(sizeof...(A) == sizeof...(P), "wrong number of kernel arguments");
    struct Ctx {
      void (*k)(P...);
      std::tuple<std::decay_t<P>...> args;
    } ctx{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(a)...)};
    LaunchSpec s{file, line, name, grid, block, smem, param_bytes(),
                 [](void* c) {
                   Ctx* x = static_cast<Ctx*>(c);
                   std::apply(x->k, x->args);  // each thread gets its own copy of the parameters
                 },
                 &ctx};
    run(s);
  }
};

template <typename... P>
Launcher<P...> launcher(const char* file, int line, const char* name, void (*kernel)(P...), dim3 grid, dim3 block,
                        size_t smem, cudaStream_t) {
  return Launcher<P...>{file, line, name, kernel, grid, block, smem};
}

}  // namespace cuemu

// --- built-in variables ------------------------------------------------------------------------
#define threadIdx (static_cast<const uint3&>(::cuemu::current->idx))
#define blockIdx (::cuemu::block_idx())
#define blockDim (::cuemu::block_dim())
#define gridDim (::cuemu::grid_dim())
#define warpSize 32

// --- barriers and warp operations (macros, so that errors name the caller's file and line) ------
#define __syncthreads() ((void)::cuemu::sync_block(__FILE__, __LINE__, ::cuemu::BarKind::kPlain, 0))
#define __syncthreads_or(p) ::cuemu::sync_block(__FILE__, __LINE__, ::cuemu::BarKind::kOr, (p) ? 1 : 0)
#define __syncthreads_and(p) ::cuemu::sync_block(__FILE__, __LINE__, ::cuemu::BarKind::kAnd, (p) ? 1 : 0)
#define __syncthreads_count(p) ::cuemu::sync_block(__FILE__, __LINE__, ::cuemu::BarKind::kCount, (p) ? 1 : 0)
#define __syncwarp(...) ::cuemu::SyncwarpAt{__FILE__, __LINE__}(__VA_ARGS__)  // the mask is optional
#define __shfl_sync(m, v, ...) ::cuemu::shfl(__FILE__, __LINE__, ::cuemu::WarpOp::kIdx, (m), (v), __VA_ARGS__)
#define __shfl_up_sync(m, v, ...) ::cuemu::shfl(__FILE__, __LINE__, ::cuemu::WarpOp::kUp, (m), (v), __VA_ARGS__)
#define __shfl_down_sync(m, v, ...) ::cuemu::shfl(__FILE__, __LINE__, ::cuemu::WarpOp::kDown, (m), (v), __VA_ARGS__)
#define __shfl_xor_sync(m, v, ...) ::cuemu::shfl(__FILE__, __LINE__, ::cuemu::WarpOp::kXor, (m), (v), __VA_ARGS__)
#define __ballot_sync(m, p) \
  ((unsigned)::cuemu::warp_op(__FILE__, __LINE__, ::cuemu::WarpOp::kBallot, (m), (p) ? 1 : 0, 0, 32))
#define __any_sync(m, p) ((int)::cuemu::warp_op(__FILE__, __LINE__, ::cuemu::WarpOp::kAny, (m), (p) ? 1 : 0, 0, 32))
#define __all_sync(m, p) ((int)::cuemu::warp_op(__FILE__, __LINE__, ::cuemu::WarpOp::kAll, (m), (p) ? 1 : 0, 0, 32))

namespace cuemu {
struct SyncwarpAt {
  const char* file;
  int line;
  void operator()(unsigned mask = 0xffffffffu) const { warp_op(file, line, WarpOp::kSync, mask, 0, 0, 32); }
};
}  // namespace cuemu

// --- atomics (blocks run concurrently on OS threads: these are real atomics) ---------------------
template <typename T>
inline T cuemu_cas_update(T* addr, T (*f)(T, T), T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics on 4- or 8-byte values");
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  U* a = reinterpret_cast<U*>(addr);
  U old = __atomic_load_n(a, __ATOMIC_RELAXED), next;
  T o;
  do {
    std::memcpy(&o, &old, sizeof(T));
    T n = f(o, v);
    std::memcpy(&next, &n, sizeof(T));
  } while (!__atomic_compare_exchange_n(a, &old, next, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return o;
}
template <typename T>
inline T atomicAdd(T* a, T v) {
  if constexpr (std::is_integral<T>::value) return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
  else return cuemu_cas_update<T>(a, [](T x, T y) { return x + y; }, v);
}
template <typename T>
inline T atomicSub(T* a, T v) { return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicExch(T* a, T v) {
  if constexpr (std::is_integral<T>::value) return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);
  else return cuemu_cas_update<T>(a, [](T, T y) { return y; }, v);
}
template <typename T>
inline T atomicMax(T* a, T v) { return cuemu_cas_update<T>(a, [](T x, T y) { return x > y ? x : y; }, v); }
template <typename T>
inline T atomicMin(T* a, T v) { return cuemu_cas_update<T>(a, [](T x, T y) { return x < y ? x : y; }, v); }
template <typename T>
inline T atomicAnd(T* a, T v) { return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicOr(T* a, T v) { return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicXor(T* a, T v) { return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T atomicCAS(T* a, T compare, T v) {
  __atomic_compare_exchange_n(a, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;  // the old value either way
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T>
inline T __ldg(const T* p) { return *p; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }

// --- device math the kernels use, from the host C library -----------------------------------------
using std::isfinite;
using std::isinf;
using std::isnan;
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }

// --- the runtime API the host code calls (everything is synchronous here) ------------------------
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "cuemu error"; }
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t = nullptr) {
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  std::memcpy(dst, src, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t = nullptr) {
  std::memset(p, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
