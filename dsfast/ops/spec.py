"""What an op is: its sources, how to build it, and the pure-torch module that stands in for it."""
from dataclasses import dataclass, field
from typing import Tuple


@dataclass(frozen=True)
class OpSpec:
    name: str                      # import name of the extension, e.g. "cpu_optim"
    sources: Tuple[str, ...]       # paths relative to the csrc/ root
    reference: str                 # dotted module with the same functions, in pure torch
    # Dotted module wrapping the op's torch.ops.dsfast.* operators in those same functions. Set: the
    # binary is a torch library (csrc/bindings/op_abi.h), loaded with torch.ops.load_library. Empty: the
    # binary is itself a Python extension module (the loader's tests use such ops).
    frontend: str = ""
    with_cuda: bool = False        # needs nvcc and a CUDA torch
    extra_cflags: Tuple[str, ...] = field(default_factory=tuple)
    extra_cuda_cflags: Tuple[str, ...] = field(default_factory=tuple)
