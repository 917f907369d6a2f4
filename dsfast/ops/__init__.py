"""dsfast native ops: one loader for every op (prebuilt -> JIT cache -> pure-torch reference).

Importing this package builds and imports nothing heavy; `load(name)` does the work on first use.
"""
from .errors import DsfastOpError, DsfastOpLockTimeout, DsfastOpWarning
from .loader import get_spec, load, loaded_from
from .spec import OpSpec

__all__ = ["load", "loaded_from", "get_spec", "OpSpec", "DsfastOpError", "DsfastOpLockTimeout",
           "DsfastOpWarning"]


def __getattr__(name):
    # deepspeed.ops.__compatible_ops__ (DeepSpeed's tests and programs gate on it, e.g. [CPUAdamBuilder.NAME]): which
    # op builders load here; read on first use, since git_version_info imports torch
    if name == "__compatible_ops__":
        from ..git_version_info import compatible_ops
        return compatible_ops
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
