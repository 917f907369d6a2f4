"""dsfast native ops: one loader for every op (prebuilt -> JIT cache -> pure-torch reference).

Importing this package builds and imports nothing heavy; `load(name)` does the work on first use.
"""
from .errors import DsfastOpError, DsfastOpLockTimeout, DsfastOpWarning
from .loader import get_spec, load, loaded_from
from .spec import OpSpec

__all__ = ["load", "loaded_from", "get_spec", "OpSpec", "DsfastOpError", "DsfastOpLockTimeout",
           "DsfastOpWarning"]
