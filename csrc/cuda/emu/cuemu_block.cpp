// cuemu's scheduler of one block: all its CUDA threads on one OS thread, each run until it yields
// (a barrier, a warp operation, its end), in forward, reverse or random order; a block where no
// thread can continue is a deadlock, reported with where each thread waits (cuemu_runtime.h).
#include "cuemu_runtime.h"

#include <algorithm>
#include <sstream>
#include <string>

namespace cuemu {

thread_local Thread* current = nullptr;

const uint3& block_idx() { return current->block->idx; }
const dim3& block_dim() { return current->block->launch->spec.block; }
const dim3& grid_dim() { return current->block->launch->spec.grid; }

namespace detail {

namespace {

void shuffle_order(Block& b) {
  if (cfg().order == Order::kRandom) std::shuffle(b.order.begin(), b.order.end(), b.rng);
}

std::string describe_waits(Block& b) {
  // One line per run of consecutive threads waiting at the same place.
  std::ostringstream os;
  std::string prev;
  int first = -1, lines = 0;
  auto flush = [&](int last) {
    if (first < 0 || prev.empty()) return;
    if (++lines > 16) return;
    os << "\n  threads " << first << ".." << last << " (linear index) of block " << idx3(b.idx) << " wait at " << prev;
  };
  for (const Thread& t : b.threads) {
    std::string what;
    if (t.state == Thread::kAtBarrier) {
      what = std::string(bar_name(b.bar_kind)) + " at " + where(t.file, t.line);
    } else if (t.state == Thread::kAtWarpOp) {
      for (const WarpGroup& g : b.groups[t.warp])
        if (g.arrived & (1u << t.lane))
          what = std::string(op_name(g.op)) + " at " + where(t.file, t.line) + " (mask " + hex(g.mask) +
                 ", lanes " + hex(g.mask & ~g.arrived) + " of warp " + std::to_string(t.warp) + " never arrive)";
    }
    if (what != prev || t.linear == 0) {
      flush(t.linear - 1);
      prev = what;
      first = t.linear;
    }
  }
  flush((int)b.threads.size() - 1);
  if (lines > 16) os << "\n  ... (" << lines - 16 << " more)";
  return os.str();
}

}  // namespace

void run_block(Launch& L, uint3 bidx, uint64_t block_linear) {
  Block b;
  b.launch = &L;
  b.idx = bidx;
  const dim3 bd = L.spec.block;
  const int n = L.nthreads;
  b.threads.resize(n);
  b.groups.resize((n + 31) / 32);
  b.rng.seed(cfg().seed * 0x9E3779B97F4A7C15ull + block_linear);
  for (int i = 0; i < n; ++i) {
    Thread& t = b.threads[i];
    t.idx = uint3{unsigned(i % bd.x), unsigned((i / bd.x) % bd.y), unsigned(i / (bd.x * bd.y))};
    t.linear = i;
    t.lane = i % 32;
    t.warp = i / 32;
    t.block = &b;
    t.stack = fiber_stack(i);
    t.stack_size = kStackBytes;
    init_thread_stack(t);
  }
  b.order.resize(n);
  for (int i = 0; i < n; ++i) b.order[i] = cfg().order == Order::kReverse ? n - 1 - i : i;

  while (b.exited < n) {
    shuffle_order(b);
    bool ran = false;
    for (int i : b.order) {
      Thread& t = b.threads[i];
      if (t.state != Thread::kRunnable) continue;
      ran = true;
      current = &t;
      resume(b, t);
      current = nullptr;
      if (!b.error.empty()) {
        L.fail(b.error);
        return;
      }
      if (L.failed.load(std::memory_order_relaxed)) return;
    }
    if (!ran) {
      L.fail(where(L.spec.file, L.spec.line) + ": deadlock in " + b.kernel() + ": no thread of block " +
             idx3(bidx) + " can continue;" + describe_waits(b));
      return;
    }
  }
}

}  // namespace detail
}  // namespace cuemu
