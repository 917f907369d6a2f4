"""A throw-away `deepspeed` package that is dsfast, so unchanged DeepSpeed programs run against dsfast.

make_deepspeed_shim(dir) writes dir/deepspeed/__init__.py: `from dsfast import *`, every deepspeed.X that
programs import registered in sys.modules as the matching dsfast module, anything else forwarded to dsfast.
shim_env(dir) is the environment (for dist_launch.launch's extra_env) that puts the shim first on the path,
ahead of a real DeepSpeed installation.
"""
import os

from dist_launch import REPO

# deepspeed.<name> -> dsfast.<name>; add here what new programs import
SUBMODULES = ("accelerator", "comm", "moe", "moe.utils", "moe.layer", "ops", "ops.adam", "optim", "utils",
              "utils.zero_to_fp32", "utils.logging", "utils.timer", "compression", "compression.helper", "launcher",
              "launcher.runner", "runtime", "runtime.lr_schedules", "runtime.utils", "runtime.zero", "checkpointing",
              "zero", "profiling", "profiling.flops_profiler")

SHIM = '''"""Test shim: `import deepspeed` is dsfast (written by tests/distributed/deepspeed_shim.py)."""
import importlib as _importlib
import sys as _sys

import dsfast as _dsfast
from dsfast import *  # noqa: F401,F403
from dsfast import __version__  # noqa: F401

for _name in {submodules!r}:
    _module = _importlib.import_module("dsfast." + _name)
    _sys.modules[__name__ + "." + _name] = _module
    if "." not in _name:
        globals()[_name] = _module


def __getattr__(name):
    return getattr(_dsfast, name)
'''


def make_deepspeed_shim(directory):
    """Write the shim package under `directory`; returns `directory` (the path entry to prepend)."""
    package = os.path.join(str(directory), "deepspeed")
    os.makedirs(package, exist_ok=True)
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write(SHIM.format(submodules=SUBMODULES))
    return str(directory)


def shim_env(directory):
    """extra_env for launch(): the shim first, then this repository (dist_launch puts REPO on the path too)."""
    path = os.pathsep.join([make_deepspeed_shim(directory), REPO, os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path}
