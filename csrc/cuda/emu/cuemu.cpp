// cuemu runtime: fibers, the per-block scheduler, barriers, warp rendezvous, launches and the
// strict checks (see cuemu.h). Written for x86-64 Linux (System V ABI).
#include "cuemu.h"

#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
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

// void cuemu_switch(void** save_sp, void* next_sp): saves the callee-saved registers, the SSE
// control/status word and the x87 control word on the current stack, stores the stack pointer
// in *save_sp, loads next_sp and restores the same from there. A new fiber's stack is laid out
// so that its first switch "returns" into cuemu_fiber_start with the Thread* in r12.
asm(R"(
  .text
  .globl cuemu_switch
  .type cuemu_switch, @function
cuemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size cuemu_switch, .-cuemu_switch

  .globl cuemu_fiber_start
  .type cuemu_fiber_start, @function
cuemu_fiber_start:
  movq %r12, %rdi
  andq $-16, %rsp
  call cuemu_fiber_main
  ud2
  .size cuemu_fiber_start, .-cuemu_fiber_start
)");

extern "C" void cuemu_switch(void** save_sp, void* next_sp);
extern "C" void cuemu_fiber_start();
extern "C" [[noreturn]] void cuemu_fiber_main(cuemu::Thread* t);

namespace cuemu {

thread_local Thread* current = nullptr;

namespace {

constexpr int kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockX = 1024, kMaxBlockY = 1024, kMaxBlockZ = 64;
constexpr unsigned kMaxGridX = 2147483647u, kMaxGridYZ = 65535;
constexpr size_t kMaxParamBytes = 32764;
constexpr size_t kMaxDynamicSmem = 48 * 1024;  // without cudaFuncSetAttribute's opt-in
#if CUEMU_ASAN
constexpr size_t kStackBytes = 512 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif
constexpr size_t kGuardBytes = 4096;

struct Settings {
  Order order = Order::kForward;
  uint64_t seed = 0;
  int workers = 0;
  Settings() {
    if (const char* o = std::getenv("CUEMU_ORDER")) {
      std::string s(o);
      order = s == "reverse" ? Order::kReverse : s == "random" ? Order::kRandom : Order::kForward;
    }
    if (const char* s = std::getenv("CUEMU_SEED")) seed = std::strtoull(s, nullptr, 10);
    if (const char* w = std::getenv("CUEMU_WORKERS")) workers = std::atoi(w);
  }
};
Settings& settings() {
  static Settings s;
  return s;
}

std::string where(const char* file, int line) { return std::string(file ? file : "?") + ":" + std::to_string(line); }

std::string idx3(const uint3& v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

const char* op_name(WarpOp op) {
  switch (op) {
    case WarpOp::kIdx: return "__shfl_sync";
    case WarpOp::kUp: return "__shfl_up_sync";
    case WarpOp::kDown: return "__shfl_down_sync";
    case WarpOp::kXor: return "__shfl_xor_sync";
    case WarpOp::kBallot: return "__ballot_sync";
    case WarpOp::kAny: return "__any_sync";
    case WarpOp::kAll: return "__all_sync";
    case WarpOp::kSync: return "__syncwarp";
  }
  return "?";
}

const char* bar_name(BarKind k) {
  switch (k) {
    case BarKind::kPlain: return "__syncthreads";
    case BarKind::kOr: return "__syncthreads_or";
    case BarKind::kAnd: return "__syncthreads_and";
    case BarKind::kCount: return "__syncthreads_count";
  }
  return "?";
}

std::string hex(unsigned m) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", m);
  return b;
}

// Fiber stacks, mapped once per OS thread that runs blocks and reused (a guard page below each).
struct Stacks {
  char* base = nullptr;
  size_t count = 0;
  ~Stacks() {
    if (base) munmap(base, count * (kStackBytes + kGuardBytes));
  }
  char* get(int i) {
    if (base == nullptr) {
      count = kMaxThreadsPerBlock;
      const size_t bytes = count * (kStackBytes + kGuardBytes);
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw Error("cuemu: cannot map fiber stacks");
      base = static_cast<char*>(p);
      for (size_t k = 0; k < count; ++k) mprotect(base + k * (kStackBytes + kGuardBytes), kGuardBytes, PROT_NONE);
    }
    return base + i * (kStackBytes + kGuardBytes) + kGuardBytes;
  }
};
thread_local Stacks tl_stacks;

std::mutex& sizes_mu() {
  static std::mutex m;
  return m;
}
std::map<std::string, int>& sizes() {
  static std::map<std::string, int> m;
  return m;
}

}  // namespace

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

  std::string name(const Thread& t) const { return "thread " + idx3(t.idx) + " of block " + idx3(idx); }
  std::string kernel() const { return std::string("kernel ") + launch->spec.kernel + " (launched at " +
                                      where(launch->spec.file, launch->spec.line) + ")"; }
};

const uint3& block_idx() { return current->block->idx; }
const dim3& block_dim() { return current->block->launch->spec.block; }
const dim3& grid_dim() { return current->block->launch->spec.grid; }

namespace {

Settings& cfg() { return settings(); }

// Switch from the running CUDA thread back to its block's scheduler.
void to_scheduler(Thread* t) {
  Block* b = t->block;
#if CUEMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(t->state == Thread::kExited ? nullptr : &fake, b->sched_stack_bottom,
                                 b->sched_stack_size);
  cuemu_switch(&t->sp, b->sched_sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  cuemu_switch(&t->sp, b->sched_sp);
#endif
}

// An error inside a CUDA thread unwinds its fiber (so that nothing on its stack leaks) up to
// cuemu_fiber_main, which records it for the block and leaves.
struct Abort {
  std::string msg;
};
[[noreturn]] void fail_here(Thread*, const std::string& msg) { throw Abort{msg}; }

void init_thread_stack(Thread& t) {
#if CUEMU_ASAN
  __asan_unpoison_memory_region(t.stack, t.stack_size);
#endif
  // From the top: [return address = cuemu_fiber_start][rbp rbx r12 r13 r14 r15][mxcsr|fpucw].
  uint64_t* top = reinterpret_cast<uint64_t*>(t.stack + t.stack_size);
  top -= 2;  // keep 16-byte room above the return address
  uint64_t* sp = top - 8;
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  std::memset(sp, 0, 8 * sizeof(uint64_t));
  std::memcpy(reinterpret_cast<char*>(sp), &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(sp) + 4, &fpucw, 2);
  // sp[1]=r15 sp[2]=r14 sp[3]=r13 sp[4]=r12 sp[5]=rbx sp[6]=rbp sp[7]=return address
  sp[4] = reinterpret_cast<uint64_t>(&t);
  sp[7] = reinterpret_cast<uint64_t>(&cuemu_fiber_start);
  t.sp = sp;
}

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

// Run every CUDA thread of one block to its end.
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
    t.stack = tl_stacks.get(i);
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
#if CUEMU_ASAN
      __sanitizer_start_switch_fiber(&b.fake_stack, t.stack, t.stack_size);
      cuemu_switch(&b.sched_sp, t.sp);
      __sanitizer_finish_switch_fiber(b.fake_stack, nullptr, nullptr);
#else
      cuemu_switch(&b.sched_sp, t.sp);
#endif
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

}  // namespace

std::string launch_sizes() {
  std::lock_guard<std::mutex> g(sizes_mu());
  std::string out;
  for (const auto& kv : sizes()) out += kv.first + " " + std::to_string(kv.second) + "\n";
  return out;
}

void set_order(Order order, uint64_t seed) {
  cfg().order = order;
  cfg().seed = seed;
}
void set_workers(int workers) { cfg().workers = workers; }
Order order() { return cfg().order; }

int sync_block(const char* file, int line, BarKind kind, int predicate) {
  Thread* t = current;
  Block& b = *t->block;
  if (b.exited > 0) {
    for (const Thread& o : b.threads)
      if (o.state == Thread::kExited)
        fail_here(t, where(file, line) + ": " + bar_name(kind) + " in " + b.kernel() + " waits for " + b.name(o) +
                         ", which has exited: every thread of the block must reach the barrier");
  }
  if (b.at_barrier > 0 && (std::strcmp(b.bar_file, file) != 0 || b.bar_line != line || b.bar_kind != kind)) {
    for (const Thread& o : b.threads)
      if (o.state == Thread::kAtBarrier)
        fail_here(t, where(file, line) + ": threads of block " + idx3(b.idx) + " in " + b.kernel() +
                         " wait at different barriers: " + b.name(*t) + " at " + bar_name(kind) + " here, " +
                         b.name(o) + " at " + bar_name(b.bar_kind) + " at " + where(b.bar_file, b.bar_line));
  }
  if (b.at_barrier == 0) {
    b.bar_file = file;
    b.bar_line = line;
    b.bar_kind = kind;
    b.bar_acc = kind == BarKind::kAnd ? 1 : 0;
  }
  switch (kind) {
    case BarKind::kPlain: break;
    case BarKind::kOr: b.bar_acc |= predicate; break;
    case BarKind::kAnd: b.bar_acc &= predicate; break;
    case BarKind::kCount: b.bar_acc += predicate; break;
  }
  t->file = file;
  t->line = line;
  t->state = Thread::kAtBarrier;
  if (++b.at_barrier == (int)b.threads.size()) {
    for (Thread& o : b.threads) {
      o.bar_result = b.bar_acc;
      o.state = Thread::kRunnable;
    }
    b.at_barrier = 0;
  }
  to_scheduler(t);  // yield even as the last to arrive, so that every order is exercised
  return t->bar_result;
}

uint64_t warp_op(const char* file, int line, WarpOp op, unsigned mask, uint64_t value, int arg, int width) {
  Thread* t = current;
  Block& b = *t->block;
  const unsigned me = 1u << t->lane;
  const int lanes_here = std::min(32, (int)b.threads.size() - t->warp * 32);
  const unsigned existing = lanes_here == 32 ? 0xffffffffu : ((1u << lanes_here) - 1);
  auto at = [&] { return where(file, line) + ": " + op_name(op) + " in " + b.kernel() + ", " + b.name(*t) + ": "; };
  if (!(mask & me)) fail_here(t, at() + "the mask " + hex(mask) + " does not name the calling lane " + std::to_string(t->lane));
  if (mask & ~existing)
    fail_here(t, at() + "the mask " + hex(mask) + " names lanes that do not exist in this warp (" + hex(mask & ~existing) + ")");
  if (width <= 0 || width > 32 || (width & (width - 1)))
    fail_here(t, at() + "width " + std::to_string(width) + " is not a power of two up to 32");
  for (int l = 0; l < 32; ++l)
    if (mask & (1u << l)) {
      const Thread& o = b.threads[t->warp * 32 + l];
      if (o.state == Thread::kExited)
        fail_here(t, at() + "the mask " + hex(mask) + " names lane " + std::to_string(l) + " (" + b.name(o) +
                         "), which has exited");
    }
  std::vector<WarpGroup>& gs = b.groups[t->warp];
  WarpGroup* g = nullptr;
  for (WarpGroup& x : gs)
    if (x.mask & mask) {
      if (x.mask != mask || x.op != op || std::strcmp(x.file, file) != 0 || x.line != line) {
        int other = __builtin_ctz(x.arrived);
        fail_here(t, at() + "lanes of warp " + std::to_string(t->warp) + " wait at different warp operations: lane " +
                         std::to_string(t->lane) + " here with mask " + hex(mask) + ", lane " + std::to_string(other) +
                         " at " + op_name(x.op) + " at " + where(x.file, x.line) + " with mask " + hex(x.mask));
      }
      g = &x;
    }
  if (g == nullptr) {
    gs.push_back(WarpGroup{file, line, op, mask, 0});
    g = &gs.back();
  }
  t->value = value;
  t->arg = arg;
  t->width = width;
  t->file = file;
  t->line = line;
  t->state = Thread::kAtWarpOp;
  g->arrived |= me;
  if (g->arrived == mask) {
    Thread* w = &b.threads[t->warp * 32];
    unsigned ballot = 0;
    for (int l = 0; l < 32; ++l)
      if ((mask >> l) & 1u && w[l].value) ballot |= 1u << l;
    for (int l = 0; l < 32; ++l) {
      if (!((mask >> l) & 1u)) continue;
      Thread& x = w[l];
      const int wd = x.width, base = l & ~(wd - 1);
      int src = l;
      switch (op) {
        case WarpOp::kIdx: src = base + (x.arg & (wd - 1)); break;
        case WarpOp::kUp: src = (l - base) >= x.arg ? l - x.arg : l; break;
        case WarpOp::kDown: src = (l - base) + x.arg < wd ? l + x.arg : l; break;
        // PTX shfl.bfly: a lane of an earlier segment may be read, a later one gives the own value
        case WarpOp::kXor: src = (l ^ x.arg) <= base + wd - 1 ? (l ^ x.arg) : l; break;
        default: break;
      }
      if (op == WarpOp::kIdx || op == WarpOp::kUp || op == WarpOp::kDown || op == WarpOp::kXor) {
        if (src < 0 || src > 31 || !((mask >> src) & 1u))
          fail_here(t, where(file, line) + ": " + op_name(op) + " in " + b.kernel() + ": lane " + std::to_string(l) +
                           " of warp " + std::to_string(t->warp) + " reads lane " + std::to_string(src) +
                           ", which the mask " + hex(mask) + " does not name");
        x.result = w[src].value;
      } else if (op == WarpOp::kBallot) {
        x.result = ballot;
      } else if (op == WarpOp::kAny) {
        x.result = ballot != 0;
      } else if (op == WarpOp::kAll) {
        x.result = ballot == mask;
      }
      x.state = Thread::kRunnable;
    }
    gs.erase(gs.begin() + (g - gs.data()));
  }
  to_scheduler(t);
  return t->result;
}

void run(const LaunchSpec& spec) {
  const std::string at = where(spec.file, spec.line) + ": launch of " + spec.kernel + ": ";
  const dim3 g = spec.grid, bl = spec.block;
  auto bad = [&](const std::string& why) { throw Error(at + why); };
  if (bl.x == 0 || bl.y == 0 || bl.z == 0 || g.x == 0 || g.y == 0 || g.z == 0)
    bad("a grid or block dimension is 0 (grid " + idx3(uint3{g.x, g.y, g.z}) + ", block " + idx3(uint3{bl.x, bl.y, bl.z}) + ")");
  if (bl.x > kMaxBlockX || bl.y > kMaxBlockY || bl.z > kMaxBlockZ)
    bad("block " + idx3(uint3{bl.x, bl.y, bl.z}) + " exceeds the per-dimension limits (1024, 1024, 64)");
  if ((uint64_t)bl.x * bl.y * bl.z > (uint64_t)kMaxThreadsPerBlock)
    bad(std::to_string((uint64_t)bl.x * bl.y * bl.z) + " threads per block exceed the limit of 1024");
  if (g.x > kMaxGridX || g.y > kMaxGridYZ || g.z > kMaxGridYZ)
    bad("grid " + idx3(uint3{g.x, g.y, g.z}) + " exceeds the limits (2^31-1, 65535, 65535)");
  if (spec.param_bytes > kMaxParamBytes)
    bad(std::to_string(spec.param_bytes) + " bytes of kernel parameters exceed the limit of 32764");
  if (spec.smem > kMaxDynamicSmem)
    bad(std::to_string(spec.smem) + " bytes of dynamic shared memory exceed 48 KiB");

  {
    std::lock_guard<std::mutex> g(sizes_mu());
    int& most = sizes()[spec.kernel];
    most = std::max(most, int(bl.x * bl.y * bl.z));
  }
  Launch L;
  L.spec = spec;
  L.nthreads = int(bl.x * bl.y * bl.z);
  const uint64_t nblocks = (uint64_t)g.x * g.y * g.z;
  std::vector<uint64_t> order(nblocks);
  for (uint64_t i = 0; i < nblocks; ++i) order[i] = cfg().order == Order::kReverse ? nblocks - 1 - i : i;
  if (cfg().order == Order::kRandom) {
    std::mt19937_64 rng(cfg().seed ^ 0xC0FFEEull);
    std::shuffle(order.begin(), order.end(), rng);
  }
  std::atomic<uint64_t> next{0};
  auto worker = [&]() {
    Thread* saved = current;
    for (;;) {
      const uint64_t k = next.fetch_add(1);
      if (k >= nblocks || L.failed.load()) break;
      const uint64_t b = order[k];
      uint3 bidx{unsigned(b % g.x), unsigned((b / g.x) % g.y), unsigned(b / ((uint64_t)g.x * g.y))};
      run_block(L, bidx, b);
    }
    current = saved;
  };
  int workers = cfg().workers > 0 ? cfg().workers : (int)std::max(1u, std::thread::hardware_concurrency());
  workers = (int)std::min<uint64_t>(workers, nblocks);
  if (workers <= 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (int i = 0; i < workers; ++i) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
  }
  if (L.failed) throw Error(L.error);
}

}  // namespace cuemu

using namespace cuemu;

namespace {
// Runs the kernel body in CUDA thread t; returns an error message, or "" when it ended cleanly.
std::string run_thread(Thread* t) {
  try {
    t->block->launch->spec.entry(t->block->launch->spec.ctx);
  } catch (const Abort& a) {
    return a.msg;
  } catch (const std::exception& e) {
    return std::string("exception in ") + t->block->kernel() + ": " + e.what();
  }
  Block& b = *t->block;
  // A thread leaving while others wait for it: at a block barrier, or named by a warp mask.
  if (b.at_barrier > 0)
    return where(b.bar_file, b.bar_line) + ": " + bar_name(b.bar_kind) + " in " + b.kernel() + " waits for " +
           b.name(*t) + ", which has exited: every thread of the block must reach the barrier";
  for (const WarpGroup& g : b.groups[t->warp])
    if (g.mask & (1u << t->lane))
      return where(g.file, g.line) + ": " + op_name(g.op) + " in " + b.kernel() + ": the mask " + hex(g.mask) +
             " names lane " + std::to_string(t->lane) + " (" + b.name(*t) + "), which has exited";
  return std::string();
}
}  // namespace

extern "C" [[noreturn]] void cuemu_fiber_main(Thread* t) {
#if CUEMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &t->block->sched_stack_bottom, &t->block->sched_stack_size);
#endif
  {
    std::string err = run_thread(t);
    Block& b = *t->block;
    if (!err.empty()) {
      if (b.error.empty()) b.error = std::move(err);
    } else {
      ++b.exited;
    }
  }  // nothing left on this stack to destroy
  t->state = Thread::kExited;
  to_scheduler(t);
  std::abort();  // never resumed
}
