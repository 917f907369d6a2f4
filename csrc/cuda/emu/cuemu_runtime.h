// cuemu's runtime internals, shared by its files (the public API is cuemu.h):
//   cuemu_fiber.cpp    the fibers: context switch, stacks, a CUDA thread's start and end
//   cuemu_block.cpp    the scheduler of one block's threads, deadlock reports
//   cuemu_barrier.cpp  block barriers (__syncthreads*)
//   cuemu_warp.cpp     warp rendezvous (__shfl*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp)
//   cuemu_launch.cpp   launches: the limit checks, order settings, blocks spread over OS threads
//   cuemu_names.cpp    how errors name places, threads and operations
// Written for x86-64 Linux (System V ABI).
#pragma once

#include "cuemu.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#error "cuemu's context switch is written for x86-64"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define CUEMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define CUEMU_ASAN 0
#endif

namespace cuemu {

namespace detail {

constexpr int kMaxThreadsPerBlock = 1024;
#if CUEMU_ASAN
constexpr size_t kStackBytes = 512 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif

struct Settings {
  Order order = Order::kForward;
  uint64_t seed = 0;
  int workers = 0;
  Settings();  // from CUEMU_ORDER, CUEMU_SEED, CUEMU_WORKERS
};
Settings& cfg();  // the process's settings (cuemu_launch.cpp)

std::string where(const char* file, int line);
std::string idx3(const uint3& v);
const char* op_name(WarpOp op);
const char* bar_name(BarKind k);
std::string hex(unsigned m);

}  // namespace detail

// A pending warp operation: the lanes its mask names meet here.
struct WarpGroup {
  const char* file;
  int line;
  WarpOp op;
  unsigned mask;
  unsigned arrived;
};

struct Launch {
  LaunchSpec spec;
  int nthreads;
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string error;  // the first error
  void fail(const std::string& msg) {
    std::lock_guard<std::mutex> g(mu);
    if (!failed.exchange(true)) error = msg;
  }
};

struct Block {
  Launch* launch;
  uint3 idx;
  std::vector<Thread> threads;
  std::vector<int> order;
  std::mt19937_64 rng;
  void* sched_sp = nullptr;
  int exited = 0;
  // block barrier
  int at_barrier = 0;
  const char* bar_file = nullptr;
  int bar_line = 0;
  BarKind bar_kind = BarKind::kPlain;
  int bar_acc = 0;
  // warp rendezvous
  std::vector<std::vector<WarpGroup>> groups;  // per warp
  std::string error;
#if CUEMU_ASAN
  void* fake_stack = nullptr;
  const void* sched_stack_bottom = nullptr;
  size_t sched_stack_size = 0;
#endif

  std::string name(const Thread& t) const {
    return "thread " + detail::idx3(t.idx) + " of block " + detail::idx3(idx);
  }
  std::string kernel() const { return std::string("kernel ") + launch->spec.kernel + " (launched at " +
                                      detail::where(launch->spec.file, launch->spec.line) + ")"; }
};

namespace detail {

// An error inside a CUDA thread unwinds its fiber (so that nothing on its stack leaks) up to
// cuemu_fiber_main, which records it for the block and leaves.
struct Abort {
  std::string msg;
};
[[noreturn]] inline void fail_here(Thread*, const std::string& msg) { throw Abort{msg}; }

// cuemu_fiber.cpp
char* fiber_stack(int i);            // CUDA thread i's stack on this OS thread
void init_thread_stack(Thread& t);   // t's first switch enters its kernel body
void resume(Block& b, Thread& t);    // runs t until it yields back to b's scheduler
void to_scheduler(Thread* t);        // yields the running CUDA thread t to its block's scheduler

// cuemu_block.cpp: runs every CUDA thread of one block to its end.
void run_block(Launch& L, uint3 bidx, uint64_t block_linear);

}  // namespace detail
}  // namespace cuemu
