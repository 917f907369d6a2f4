// cuemu's warp operations (__shfl*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp): a
// rendezvous of the lanes the mask names, which then exchange values as the hardware does. A mask
// that omits the caller, names a missing or exited lane, or lanes meeting at different operations
// is an error naming the places (cuemu_runtime.h).
#include "cuemu_runtime.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace cuemu {

using namespace detail;

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

}  // namespace cuemu
