"""`import deepspeed` pointed at dsfast, whichever way it is pointed, gives one copy of every module.

Programs are run against dsfast with `sys.modules["deepspeed"] = dsfast`, a `deepspeed` symlink to this package, or
a shim package mapping some deepspeed.X to dsfast.X. Python then loads any other `deepspeed.X.Y` a program imports
from dsfast's files a second time under the alias name: two CPUAdam classes (the engine's isinstance checks miss the
program's optimizer), two ZeRO hook registries, two loggers. This finder answers `alias.Y`, when `alias` is a dsfast
module under another name, with dsfast's own module.
"""
import importlib
import importlib.abc
import importlib.util
import sys


def _is_ours(module):
    name = getattr(module, "__name__", None)
    return isinstance(name, str) and (name == "dsfast" or name.startswith("dsfast."))


class DsfastAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        parent_name, dot, child = fullname.rpartition(".")
        if not dot:
            return None
        parent = sys.modules.get(parent_name)
        if parent is None or not _is_ours(parent) or parent.__name__ == parent_name:
            return None
        real = f"{parent.__name__}.{child}"
        if real not in sys.modules and importlib.util.find_spec(real) is None:
            what = getattr(sys.modules.get("dsfast"), "_NOT_SUPPORTED", {}).get(child) if parent.__name__ == "dsfast" \
                else None
            why = f"{what} is not supported by dsfast" if what else "see the README's list of what is not supported"
            raise ModuleNotFoundError(f"No module named {fullname!r}: {parent_name!r} is dsfast here, and dsfast "
                                      f"has no {real!r} ({why})", name=fullname)
        return importlib.util.spec_from_loader(fullname, self, origin=real)

    def create_module(self, spec):
        module = importlib.import_module(spec.origin)
        spec.loader_state = module.__spec__    # the import system overwrites __spec__; exec_module puts it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


def install():
    if not any(isinstance(f, DsfastAliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, DsfastAliasFinder())
