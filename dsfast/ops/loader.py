"""Turn an op name into a loaded module: prebuilt -> JIT cache/build -> pure-torch reference.

    mod = dsfast.ops.load("cpu_optim")

Never builds at import time. A missing toolchain falls back to the reference with one warning
per op; a failed compile raises DsfastOpError (op name, compiler's last lines, what to set).
DSFAST_REQUIRE_OPS=1 makes every fallback an error, =0 makes even a failed compile fall back.
"""
import importlib
import os
import threading
import warnings

from . import env, jit, prebuilt, toolchain
from .errors import DsfastOpError, DsfastOpLockTimeout, DsfastOpWarning

PREBUILT, JIT, REFERENCE = "prebuilt", "jit", "reference"
AOT_HINT = "DSFAST_BUILD_OPS=1 pip install --no-build-isolation ."

_lock = threading.RLock()
_loaded = {}        # name -> (module, origin)
_failed = {}        # name -> error message (raised again on every later call)
_announced = set()  # ops whose fallback has been announced


def get_spec(name):
    from .registry import OPS
    spec = OPS.get(name)
    if spec is None:
        known = ", ".join(sorted(OPS)) or "none"
        raise DsfastOpError(f"unknown dsfast op {name!r}; registered ops: {known}")
    return spec


def load(name):
    """The module implementing op `name` (native if possible, else its pure-torch reference)."""
    with _lock:
        if name in _loaded:
            return _loaded[name][0]
        if name in _failed:
            raise DsfastOpError(_failed[name])
        try:
            module, origin = _resolve(get_spec(name))
        except DsfastOpLockTimeout:
            raise               # another process is still building: a later call may succeed
        except DsfastOpError as e:
            _failed[name] = str(e)
            raise
        _loaded[name] = (module, origin)
        return module


def loaded_from(name):
    """'prebuilt', 'jit' or 'reference' for an op already loaded in this process, else None."""
    entry = _loaded.get(name)
    return entry[1] if entry else None


def _resolve(spec):
    env.require_mode()          # a misspelt setting is an error before anything is built
    if env.disabled(spec.name):
        return _fallback(spec, f"disabled by {env.DISABLE}={os.environ.get(env.DISABLE)}")
    module, note = prebuilt.load(spec.name)
    if module is not None:
        return module, PREBUILT
    problem = toolchain.build_problem(spec)
    if problem is not None:
        reason = f"{problem}; {note}" if note else problem
        return _fallback(spec, f"cannot build it here: {reason}")
    try:
        p = jit.plan(spec)
    except FileNotFoundError as e:       # no kernel sources in this installation
        return _fallback(spec, f"cannot build it here: {e}")
    try:
        return jit.build(p), JIT
    except jit.BuildFailed as f:
        tail = jit.tail_lines(f.output)
        if env.require_mode() == "0":
            return _fallback(spec, f"its build failed ({env.REQUIRE}=0 allows the fallback); "
                                   f"compiler's last lines:\n{tail}\nfull log: {f.log_path}")
        raise DsfastOpError(
            f"dsfast op {spec.name!r} failed to build (JIT, csrc root {p.root}, compiler "
            f"{toolchain.cxx_path()}).\nCompiler's last lines (full log: {f.log_path}):\n{tail}\n"
            f"To run with the slower pure-torch reference ({spec.reference}) instead, set "
            f"{env.REQUIRE}=0 or {env.DISABLE}={spec.name}. {env.VERBOSE}=1 prints the whole "
            f"compiler output.") from None


def _fallback(spec, why):
    if env.require_mode() == "1":
        raise DsfastOpError(
            f"dsfast op {spec.name!r} is not available: {why}. {env.REQUIRE}=1 forbids falling "
            f"back to the pure-torch reference ({spec.reference}); fix the cause above, or install "
            f"with the ops prebuilt ({AOT_HINT}), or unset {env.REQUIRE}.")
    try:
        module = importlib.import_module(spec.reference)
    except ImportError as e:
        raise DsfastOpError(f"dsfast op {spec.name!r} is not available ({why}) and its reference "
                            f"module {spec.reference!r} does not import: {e}") from None
    if spec.name not in _announced:
        _announced.add(spec.name)
        warnings.warn(DsfastOpWarning(
            f"dsfast op {spec.name!r} runs on its pure-torch reference ({spec.reference}), which is "
            f"slower: {why}. To get the native op, fix that (it is then built on first use) or "
            f"install with the ops prebuilt ({AOT_HINT}); {env.REQUIRE}=1 turns this into an error."),
            stacklevel=4)
    return module, REFERENCE
