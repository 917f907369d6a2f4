// cuemu's fibers: every CUDA thread runs on its own stack, switched by a few lines of assembly;
// here too are a CUDA thread's start and end (cuemu_runtime.h).
#include "cuemu_runtime.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

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
namespace detail {

namespace {

constexpr size_t kGuardBytes = 4096;

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

}  // namespace

char* fiber_stack(int i) { return tl_stacks.get(i); }

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

// Switch from block b's scheduler to CUDA thread t, until t switches back.
void resume(Block& b, Thread& t) {
#if CUEMU_ASAN
  __sanitizer_start_switch_fiber(&b.fake_stack, t.stack, t.stack_size);
  cuemu_switch(&b.sched_sp, t.sp);
  __sanitizer_finish_switch_fiber(b.fake_stack, nullptr, nullptr);
#else
  cuemu_switch(&b.sched_sp, t.sp);
#endif
}

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

}  // namespace detail
}  // namespace cuemu

using namespace cuemu;
using namespace cuemu::detail;

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
