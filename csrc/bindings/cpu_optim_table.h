// Helpers of the work tables, shared by each optimizer's *_table_fill_ / *_table_ ops
// (cpu_optim_adam.cpp, cpu_optim_adam8bit.cpp, cpu_optim_sgd.cpp, cpu_optim_one_state.cpp).
//
// Work tables: the eager fast path of CPUAdam / CPUAdam8bit / CPUSGD / CPUAdagrad / CPULion (dsfast/optim/_cpu_op.py).
// A table is an int64 cpu tensor with one row per param: its tensors' addresses, numel and dtype
// codes, written by the *_table_fill_ ops after the same checks as the list ops, and a strong
// reference to each of those tensors (op_abi.h hold()), given back by cpu_table_release_. A step then
// passes one tensor instead of thousands: converting and freeing 12000 list entries costs ~4 ms when
// the frees come after the kernel's pass over 1 GB (every TensorImpl a cache miss). Before writing
// anything a step checks, through those references, that every tensor still has the address and size
// it was filled with (p.data = ..., set_(), resize_() move them); if one moved it raises a ValueError
// tagged kStale, which the Python wrapper turns into False, and the caller rebuilds the table (a
// mutating op must return nothing for torch.compile to functionalise it). The check is one loop in
// C++ over both threads: ~6x cheaper than Python's data_ptr() calls once the kernel's pass over a
// gigabyte has evicted every TensorImpl.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "cpu_optim_checks.h"

namespace dsfast {
namespace __attribute__((visibility("hidden"))) cpu_bind {  // see cpu_optim_checks.h

inline constexpr const char* kStale = "[dsfast:stale-table] ";
[[noreturn]] inline void stale(const char* op) {
  value_error(std::string(kStale) + op + ": a tensor of the work table moved since it was filled");
}

inline int64_t* table_data(const OwnedTensor& t, int64_t rows, int64_t cols, const char* op) {
  auto fail = [&] {
    value_error(std::string(op) + ": the work table must be a contiguous int64 cpu tensor of shape [" +
                (rows < 0 ? std::string("n") : std::to_string(rows)) + ", " + std::to_string(cols) + "]");
  };
  if (!t.is_cpu() || t.scalar_type() != ScalarType::Long || t.dim() != 2 || t.size(1) != cols ||
      !t.is_contiguous() || (rows >= 0 && t.size(0) != rows))
    fail();
  return static_cast<int64_t*>(t.mutable_data_ptr());
}

template <typename P>
int64_t addr(P* p) { return int64_t(reinterpret_cast<intptr_t>(p)); }
template <typename P>
P* ptr(int64_t a) { return reinterpret_cast<P*>(intptr_t(a)); }

// A param or state dtype code: F32, BF16 or F16.
inline DType float_code(int64_t code, const char* op, int64_t row) {
  if (code < int64_t(DType::F32) || code > int64_t(DType::F16))
    value_error(std::string(op) + ": row " + std::to_string(row) + " of the work table is corrupt");
  return DType(code);
}

inline DType dtype_code(int64_t code, bool out, void* p, const char* op, int64_t row) {
  const bool ok = out ? (p == nullptr ? code == int64_t(DType::None)
                                       : code == int64_t(DType::BF16) || code == int64_t(DType::F16))
                      : (p != nullptr && code >= int64_t(DType::F32) && code <= int64_t(DType::F16));
  if (!ok) value_error(std::string(op) + ": row " + std::to_string(row) + " of the work table is corrupt");
  return DType(code);
}

// Whether the tensors of one row still have the addresses in columns addr_cols and the sizes numel_of(column)
// gives, read through their references in columns held_col... A row without a reference for an address
// (released, or never filled) is stale, unless that tensor is absent (a null address: no 16-bit output, no
// momentum buffer).
template <class NumelOf>
inline bool row_current(const int64_t* d, const int64_t* addr_cols, int n, int64_t held_col, NumelOf numel_of) {
  for (int k = 0; k < n; ++k) {
    const int64_t h = d[held_col + k], a = d[addr_cols[k]];
    if (h == 0) {
      if (a != 0) return false;
      continue;
    }
    const auto& t = held(h);
    if (addr(t.mutable_data_ptr()) != a || t.numel() != numel_of(addr_cols[k])) return false;
  }
  return true;
}

// The same where every tensor has `numel` elements but the step counter (column step_col), which has 1.
inline bool row_current(const int64_t* d, const int64_t* addr_cols, int n, int64_t held_col, int64_t numel,
                        int64_t step_col) {
  return row_current(d, addr_cols, n, held_col, [&](int64_t col) { return col == step_col ? 1 : numel; });
}

// Whether rows [0, n) pass row_ok(i), the rows split over the threads: each check is a few cache
// misses independent of the others, so two threads halve the wait. A check that throws (a tensor
// whose data cannot be read) fails its row instead of leaving the parallel region.
template <class RowOk>
bool all_rows(int64_t n, int64_t num_threads, RowOk row_ok) {
  auto ok = [&](int64_t i) {
    try {
      return row_ok(i);
    } catch (...) {
      return false;
    }
  };
  bool all = true;
#ifdef _OPENMP
  const int threads = num_threads > 0 ? int(num_threads) : omp_get_max_threads();
  if (threads > 1 && n >= 256) {
#pragma omp parallel for num_threads(threads) schedule(static) reduction(&& : all)
    for (int64_t i = 0; i < n; ++i) all = all && ok(i);
    return all;
  }
#endif
  for (int64_t i = 0; i < n && all; ++i) all = ok(i);
  return all;
}

inline void hold_row(int64_t* d, int64_t held_col, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) d[held_col++] = t ? hold(*t) : 0;
}

}  // namespace cpu_bind
}  // namespace dsfast
