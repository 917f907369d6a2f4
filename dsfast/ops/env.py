"""Every environment variable the op loader reads, in one place, with its meaning."""
import os
from pathlib import Path

# 1: a missing op is an error. 0: even a failed build falls back to the reference.
# unset: a missing toolchain falls back (with a warning), a failed compile is an error.
REQUIRE = "DSFAST_REQUIRE_OPS"
# "all" or comma-separated op names: use the pure-torch reference, build nothing.
DISABLE = "DSFAST_DISABLE_OPS"
# Root of the JIT build cache (default: $XDG_CACHE_HOME/dsfast or ~/.cache/dsfast).
CACHE_DIR = "DSFAST_CACHE_DIR"
# Seconds to wait for another process's build of the same op (default 600).
LOCK_TIMEOUT = "DSFAST_BUILD_LOCK_TIMEOUT"
# 1: print the compiler's output while building.
VERBOSE = "DSFAST_BUILD_VERBOSE"
# "stable" or "classic": the torch ABI torch-library ops are built for (default: stable when torch has it).
OP_ABI = "DSFAST_OP_ABI"
# Use this directory as the csrc root instead of the packaged/repo one (development, tests).
CSRC_DIR = "DSFAST_CSRC_DIR"

DEFAULT_LOCK_TIMEOUT = 600.0


def require_mode():
    """'1' (always error), '0' (always fall back) or None (the default policy)."""
    value = os.environ.get(REQUIRE, "").strip()
    if value in ("", "auto"):
        return None
    if value in ("1", "true", "yes", "on"):
        return "1"
    if value in ("0", "false", "no", "off"):
        return "0"
    raise ValueError(f"{REQUIRE}={value!r} is not valid; use 1 (error if an op is missing), "
                     f"0 (always fall back to the reference) or leave it unset")


def disabled(name):
    value = os.environ.get(DISABLE, "").strip()
    if not value:
        return False
    names = {v.strip() for v in value.split(",") if v.strip()}
    return "all" in names or "1" in names or name in names


def cache_root():
    if os.environ.get(CACHE_DIR):
        return Path(os.environ[CACHE_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dsfast"


def lock_timeout():
    value = os.environ.get(LOCK_TIMEOUT, "").strip()
    if not value:
        return DEFAULT_LOCK_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{LOCK_TIMEOUT}={value!r} is not a number of seconds") from None
    if seconds < 0:
        raise ValueError(f"{LOCK_TIMEOUT}={value!r} must be >= 0 seconds")
    return seconds


def verbose():
    return os.environ.get(VERBOSE, "").strip() in ("1", "true", "yes", "on")
