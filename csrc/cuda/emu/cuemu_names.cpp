// How cuemu's errors name places, threads and operations (cuemu_runtime.h).
#include "cuemu_runtime.h"

#include <cstdio>

namespace cuemu {
namespace detail {

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

}  // namespace detail
}  // namespace cuemu
