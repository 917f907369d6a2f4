// cuemu's block barriers (__syncthreads, _or, _and, _count): every thread of the block must reach
// the same one; a thread that has exited, or threads waiting at different barriers, is an error
// naming both places (cuemu_runtime.h).
#include "cuemu_runtime.h"

#include <cstring>
#include <string>

namespace cuemu {

using namespace detail;

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

}  // namespace cuemu
