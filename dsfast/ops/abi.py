"""Which torch ABI a torch-library op is compiled for (csrc/bindings/op_abi.h).

stable: torch's stable C ABI, targeted at STABLE_TARGET; one binary serves every torch from
    that version on, and the binding compiles in about a second. Chosen when torch supports it.
classic: torch's C++ API (TORCH_LIBRARY); tied to the exact torch it was built against.

DSFAST_OP_ABI=classic forces the classic ABI (older-torch path, testable on a new torch);
=stable makes a torch without the stable ABI an error instead of a silent fallback.
"""
import os

from . import env

STABLE, CLASSIC = "stable", "classic"
STABLE_TARGET = (2, 10)        # the oldest torch whose stable ABI has everything the bindings use
_TARGET_MACRO = "0x{:02x}{:02x}000000000000".format(*STABLE_TARGET)


def torch_version():
    import torch
    parts = []
    for piece in torch.__version__.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def choose():
    """'stable' or 'classic' for this torch and the DSFAST_OP_ABI setting."""
    wanted = os.environ.get(env.OP_ABI, "").strip().lower()
    if wanted not in ("", "auto", STABLE, CLASSIC):
        raise ValueError(f"{env.OP_ABI}={wanted!r} is not valid; use stable, classic or leave it unset")
    has_stable = torch_version() >= STABLE_TARGET
    if wanted == CLASSIC:
        return CLASSIC
    if wanted == STABLE and not has_stable:
        import torch
        raise ValueError(f"{env.OP_ABI}=stable needs torch >= {STABLE_TARGET[0]}.{STABLE_TARGET[1]}; this is torch "
                         f"{torch.__version__} (unset it to build for the classic ABI)")
    return STABLE if has_stable else CLASSIC


def label(abi):
    """How the report and build.json name an ABI: 'stable (torch >= 2.10)' or 'classic (torch 2.9.1 only)'."""
    if abi == STABLE:
        return f"stable (torch >= {STABLE_TARGET[0]}.{STABLE_TARGET[1]})"
    import torch
    return f"classic (torch {torch.__version__} only)"


def cflags(abi, with_cuda=False):
    """Preprocessor flags selecting the ABI in op_abi.h."""
    if abi == STABLE:
        flags = ("-DDSFAST_STABLE_ABI=1", f"-DTORCH_TARGET_VERSION={_TARGET_MACRO}")
        # the shim declares its CUDA stream/guard functions only under USE_CUDA
        return flags + (("-DUSE_CUDA",) if with_cuda else ())
    return ("-DDSFAST_STABLE_ABI=0",)


def works_with(abi, built_for_torch):
    """Whether a binary built for `abi` against torch `built_for_torch` can load in this torch."""
    import torch
    if abi == STABLE:
        return torch_version() >= STABLE_TARGET
    return built_for_torch == torch.__version__
