"""What state each op is in, without building or importing any of them (for `dsfast report`)."""
from . import abi, env, jit, prebuilt, toolchain
from .errors import DsfastOpError

PREBUILT, CACHED, BUILDABLE, UNAVAILABLE, DISABLED = "prebuilt", "cached", "buildable", "unavailable", "disabled"


def op_status(spec):
    """(state, detail): prebuilt / cached / buildable / unavailable / disabled, and why or where."""
    if env.disabled(spec.name):
        return DISABLED, f"{env.DISABLE} is set: the pure-torch reference {spec.reference} is used"
    origin, prebuilt_problem = prebuilt.find(spec.name)
    if origin and not prebuilt_problem:
        return PREBUILT, origin
    note = f" ({prebuilt_problem})" if prebuilt_problem else ""
    problem = toolchain.cuda_problem() if spec.with_cuda else None
    if problem:
        return UNAVAILABLE, problem + note
    try:
        p = jit.plan(spec)
    except (DsfastOpError, FileNotFoundError, ValueError) as e:
        return UNAVAILABLE, str(e) + note
    info = jit.cached_info(p.build_dir)
    if info is not None:
        took = f", built in {info['build_seconds']} s" if "build_seconds" in info else ""
        return CACHED, f"{p.build_dir}{took}{note}"
    problem = toolchain.build_problem(spec)
    if problem:
        return UNAVAILABLE, problem + note
    failed = p.build_dir / jit.FAILED
    if failed.exists():
        return BUILDABLE, f"the last build attempt failed, log: {failed}; retried at first use{note}"
    return BUILDABLE, f"JIT-built at first use into {p.build_dir}{note}"


def op_abi(spec):
    """The torch ABI `spec` is (or would be) built for: 'stable', 'classic', or None (a Python-module op)."""
    if not spec.frontend:
        return None
    info = prebuilt.build_info()
    origin, problem = prebuilt.find(spec.name)
    if origin and not problem and spec.name in info.get("abi", {}):
        return info["abi"][spec.name]
    try:
        return abi.choose()
    except ValueError:
        return None
