// Torch operators of the CPU optimizer kernels (dsfast::cpu_*): argument checks and dtype
// mapping only. The kernels (csrc/cpu) never see a torch header. Errors are
// ValueError/TypeError naming the tensor ("<label>[i]") and what would be valid.
//
// Registered with the dispatcher (op_abi.h), so FakeTensor, torch.compile and
// torch.library.opcheck see them; the fake (meta) implementations and the Python-facing
// functions are in dsfast/ops/native/cpu_optim.py. One file per kernel family:
//   cpu_optim_adam.cpp      Adam / AdamW (list and work-table ops)
//   cpu_optim_adam8bit.cpp  Adam / AdamW with 8-bit block-wise moments (list and work-table ops)
//   cpu_optim_sgd.cpp       SGD (list and work-table ops)
//   cpu_optim_one_state.cpp Adagrad and Lion (list and work-table ops)
//   cpu_optim_checks.h      the argument checks they share
//   cpu_optim_table.h       the work tables' shared helpers
// and this file: the op-wide operators (releasing a table's references, the CPU's instruction
// sets, OpenMP, the ABI).
#include <cstdint>
#include <string>

#include "../cpu/cpu_optim.h"
#include "op_abi.h"

using namespace dsfast::op;  // Tensor, Tensors, Flags, Text, value_error, type_error, ...

namespace {

// Gives back the references of a table's held columns (a copy of them: the table itself may be
// gone) and zeroes them, so a second release is a no-op.
void table_release(const OwnedTensor& held_cols) {
  if (!held_cols.is_cpu() || held_cols.scalar_type() != ScalarType::Long || !held_cols.is_contiguous())
    value_error("cpu_table_release_: expects a contiguous int64 cpu tensor of held references");
  auto* h = static_cast<int64_t*>(held_cols.mutable_data_ptr());
  for (int64_t i = 0, n = held_cols.numel(); i < n; ++i) {
    drop(h[i]);
    h[i] = 0;
  }
}

// Instruction sets this CPU can run, best first, comma-separated (a str keeps the schema
// to types both ABIs return).
std::string available_isas() {
  std::string out;
  for (auto i : {dsfast::cpu::Isa::AVX512BF16, dsfast::cpu::Isa::AVX512, dsfast::cpu::Isa::AVX2,
                 dsfast::cpu::Isa::Scalar})
    if (dsfast::cpu::isa_supported(i)) out += (out.empty() ? "" : ",") + std::string(dsfast::cpu::isa_name(i));
  return out;
}

bool openmp_enabled() { return dsfast::cpu::openmp_enabled(); }

std::string abi() { return kAbi; }

}  // namespace

DSFAST_LIBRARY(m) {
  m.def("cpu_table_release_(Tensor(a!) held) -> ()");
  m.def("cpu_available_isas() -> str");
  m.def("cpu_openmp_enabled() -> bool");
  m.def("cpu_optim_abi() -> str");
}

DSFAST_LIBRARY_IMPL(CPU, m) {
  m.impl("cpu_table_release_", DSFAST_KERNEL(table_release));
}

// No tensor arguments: nothing to dispatch on, so one kernel for every backend.
DSFAST_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  m.impl("cpu_available_isas", DSFAST_KERNEL(available_isas));
  m.impl("cpu_openmp_enabled", DSFAST_KERNEL(openmp_enabled));
  m.impl("cpu_optim_abi", DSFAST_KERNEL(abi));
}
