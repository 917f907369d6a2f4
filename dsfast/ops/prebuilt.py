"""Ops built ahead of time by `DSFAST_BUILD_OPS=1 pip install --no-build-isolation .`.

They live in the package as dsfast._ops.<name>; dsfast/_ops/build_info.json records the torch
version and ABI they were compiled for: a classic-ABI binary built for another torch crashes or fails
to import, a stable-ABI one serves every torch from its target version on.
"""
import importlib
import importlib.util
import json
from pathlib import Path

PACKAGE = "dsfast._ops"
INFO_FILE = "build_info.json"


def _ops_dir():
    return Path(__file__).resolve().parent.parent / "_ops"


def build_info():
    try:
        return json.loads((_ops_dir() / INFO_FILE).read_text())
    except (OSError, ValueError):
        return {}


def find(name):
    """(path or None, reason it can't be used or None). Imports nothing but the tiny package."""
    try:
        found = importlib.util.find_spec(f"{PACKAGE}.{name}")
    except ImportError:
        found = None
    if found is None or not found.origin:
        return None, None
    import torch

    from . import abi
    info = build_info()
    built_for = info.get("torch")
    op_abi = info.get("abi", {}).get(name, abi.CLASSIC)
    if built_for and not abi.works_with(op_abi, built_for):
        return found.origin, (f"the prebuilt {PACKAGE}.{name} was built for torch {built_for} "
                              f"({abi.label(op_abi)}), this is torch {torch.__version__}")
    recorded = info.get("sources", {}).get(name)
    if recorded and recorded != _current_digest(name):
        # An editable checkout whose kernels were edited after `DSFAST_BUILD_OPS=1 pip install -e .`.
        return found.origin, f"the kernel sources changed since {PACKAGE}.{name} was prebuilt"
    return found.origin, None


def _current_digest(name):
    from . import cache_key, paths
    from .registry import OPS
    try:
        return cache_key.sources_digest(OPS[name], paths.csrc_root())
    except (KeyError, OSError):
        return None     # no sources to compare with (a wheel without csrc): trust the binary


def load(name):
    """(module or None, note explaining why the prebuilt one was skipped or None)."""
    origin, problem = find(name)
    if origin is None:
        return None, None
    if problem:
        return None, problem
    from .jit import import_binary
    from .registry import OPS
    try:
        if name in OPS and OPS[name].frontend:
            return import_binary(OPS[name], f"{PACKAGE}.{name}", origin), None
        return importlib.import_module(f"{PACKAGE}.{name}"), None
    except (ImportError, OSError) as e:
        return None, f"the prebuilt {PACKAGE}.{name} does not import ({e})"
