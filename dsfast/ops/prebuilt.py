"""Ops built ahead of time by `DSFAST_BUILD_OPS=1 pip install --no-build-isolation .`.

They live in the package as dsfast._ops.<name>; dsfast/_ops/build_info.json records the torch
version they were compiled against, because a binary built for another torch crashes or fails
to import.
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
    info = build_info()
    built_for = info.get("torch")
    if built_for and built_for != torch.__version__:
        return found.origin, (f"the prebuilt {PACKAGE}.{name} was built for torch {built_for}, "
                              f"this is torch {torch.__version__}")
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
    try:
        return importlib.import_module(f"{PACKAGE}.{name}"), None
    except (ImportError, OSError) as e:
        return None, f"the prebuilt {PACKAGE}.{name} does not import ({e})"
