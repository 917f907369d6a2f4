"""Measurement only (deepspeed_unit_tests.py --stand-ins): placeholders for the DeepSpeed import paths that dsfast
lacks and that DeepSpeed's shared test helpers import at the top (simple_model.py: deepspeed.pipe; util.py:
deepspeed.git_version_info), so that one missing name does not fail every test file that imports those helpers.
A placeholder is used only where dsfast has no such module; using anything in it raises, and the yardstick counts
that test under "missing import path". Never on a user's path: the script puts this folder on PYTHONPATH itself."""
import importlib.abc
import importlib.util
import sys
import types

MARK = "yardstick stand-in"


class _Placeholder:
    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{MARK}: {type(self).__name__} is not in dsfast")


def _pipe(module):
    for name in ("PipelineModule", "LayerSpec", "TiedLayerSpec"):
        setattr(module, name, type(name, (_Placeholder,), {}))


def _git_version_info(module):
    import torch
    major, minor = torch.__version__.split(".")[:2]
    module.version = "0.19.8"
    module.git_hash = module.git_branch = "unknown"
    module.installed_ops = module.compatible_ops = {}
    module.torch_info = {"version": f"{major}.{minor}", "bf16_support": False, "cuda_version": "0.0",
                         "nccl_version": "0.0", "hip_version": "0.0"}


STAND_INS = {"deepspeed.pipe": _pipe, "deepspeed.git_version_info": _git_version_info}


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in STAND_INS:
            return None
        real = "dsfast" + fullname[len("deepspeed"):]
        try:
            if importlib.util.find_spec(real) is not None:
                return None                    # dsfast has it now: the real module is measured
        except ModuleNotFoundError:
            pass
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return types.ModuleType(spec.name, f"{MARK} for {spec.name}")

    def exec_module(self, module):
        STAND_INS[module.__name__](module)


try:
    import dsfast  # noqa: F401  (cheap: installs dsfast's alias finder, which must come after this one)
except ImportError:
    pass
else:
    sys.meta_path.insert(0, StandInFinder())
