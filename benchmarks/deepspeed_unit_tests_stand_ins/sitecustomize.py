"""Measurement only (deepspeed_unit_tests.py --stand-ins): a placeholder for every `deepspeed.X` module that dsfast
lacks, so that one missing import at the top of a test file (or of the shared helpers simple_model.py and util.py)
does not hide the file's other tests. Every name taken from a placeholder module is a placeholder class; calling or
instantiating it raises "yardstick stand-in ...", and the yardstick counts such a test under "missing import path".
git_version_info gets DeepSpeed's values, since util.py reads them at import. Never on a user's path: the script
puts this folder on PYTHONPATH for its dsfast runs only."""
import importlib.abc
import importlib.util
import sys
import types

MARK = "yardstick stand-in"


def _placeholder(qualname):
    def refuse(*args, **kwargs):
        raise RuntimeError(f"{MARK}: {qualname} is not in dsfast")

    return type(qualname.rpartition(".")[2], (), {"__init__": refuse, "__call__": refuse, "__module__": MARK})


def _module_getattr(module):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{module.__name__}.{name}")
        setattr(module, name, value)
        return value
    return __getattr__


def _git_version_info(module):
    import torch
    major, minor = torch.__version__.split(".")[:2]
    module.version = "0.19.8"
    module.git_hash = module.git_branch = "unknown"
    module.installed_ops = module.compatible_ops = {}
    module.torch_info = {"version": f"{major}.{minor}", "bf16_support": False, "cuda_version": "0.0",
                         "nccl_version": "0.0", "hip_version": "0.0"}


class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("deepspeed.") or "deepspeed" not in sys.modules:
            return None
        real = "dsfast" + fullname[len("deepspeed"):]
        try:
            if importlib.util.find_spec(real) is not None:
                return None                    # dsfast has it: the real module is measured
        except ModuleNotFoundError:
            pass                               # a parent is missing too (it is a stand-in itself)
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        module = types.ModuleType(spec.name, f"{MARK} for {spec.name}")
        module.__path__ = []
        return module

    def exec_module(self, module):
        if module.__name__ == "deepspeed.git_version_info":
            _git_version_info(module)
        module.__getattr__ = _module_getattr(module)


try:
    import dsfast  # noqa: F401  (cheap: installs dsfast's alias finder, which must come after this one)
except ImportError:
    pass
else:
    sys.meta_path.insert(0, StandInFinder())
