"""What an op is: its sources, how to build it, and the pure-torch module that stands in for it."""
from dataclasses import dataclass, field
from typing import Tuple


@dataclass(frozen=True)
class OpSpec:
    name: str                      # import name of the extension, e.g. "cpu_optim"
    sources: Tuple[str, ...]       # paths relative to the csrc/ root
    reference: str                 # dotted module with the same functions, in pure torch
    with_cuda: bool = False        # needs nvcc and a CUDA torch
    extra_cflags: Tuple[str, ...] = field(default_factory=tuple)
    extra_cuda_cflags: Tuple[str, ...] = field(default_factory=tuple)
