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
    built_for = build_info().get("torch")
    if built_for and built_for != torch.__version__:
        return found.origin, (f"the prebuilt {PACKAGE}.{name} was built for torch {built_for}, "
                              f"this is torch {torch.__version__}")
    return found.origin, None


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
