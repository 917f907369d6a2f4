"""DeepSpeed's ZeRO stage 3 leaf modules (`deepspeed.utils.set_z3_leaf_modules` and friends).

A leaf module's parameters, those of its whole subtree, are gathered together before its forward (and backward)
and released after; nothing inside it is hooked (dsfast/zero/params/hooks.py). An MoE block whose ranks run
different experts needs this: hooked one by one, each rank would gather only the experts it runs, and the ranks'
collectives would no longer match. The flag is the module attribute `_z3_leaf`, as in DeepSpeed; it is read when
deepspeed.initialize places the stage 3 hooks, so set it before (changing it on a module that already has them is
an error). zero_optimization.leaf_module in the config names leaf modules too (apply_zero_leaf_module_config).
"""
import torch

from ..config.zero import DEFAULT_LEAF_MODULE_CLASSES
from .log import logger


class LeafModuleClassError(TypeError, AssertionError):
    """A leaf module class that is neither a class nor a class name (DeepSpeed asserts: AssertionError)."""


def z3_leaf_module(model):
    """Whether `model` is flagged as a leaf module."""
    return bool(getattr(model, "_z3_leaf", False))


def z3_leaf_parameter(param):
    """Whether `param` belongs to a leaf module (set on its parameters when the stage 3 hooks are placed)."""
    return hasattr(param, "ds_z3_leaf_module")


def get_z3_leaf_modules(model):
    """The modules of `model` flagged as leaf modules, in model.modules() order."""
    return [m for m in model.modules() if z3_leaf_module(m)]


def set_z3_leaf_module(model, flag):
    _flag([model], flag)


def _flag(modules, flag):
    for m in modules:   # all checked before any changes
        _refuse_after_initialize(m, flag)
    for m in modules:
        m._z3_leaf = flag


def _class_matches(module, spec):
    if isinstance(spec, type):
        return isinstance(module, spec)   # subclasses too
    cls = type(module)
    return spec in (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")


def _set_by_class(model, leaf_module_classes, flag, raise_if_not_found):
    if isinstance(leaf_module_classes, (type, str)):
        raise LeafModuleClassError(f"leaf_module_classes must be a list of classes or class names; got the single "
                                   f"{leaf_module_classes!r}: put it in a list")
    specs = list(leaf_module_classes)
    bad = [s for s in specs if not isinstance(s, (type, str))]
    if bad:
        raise LeafModuleClassError(f"leaf_module_classes must be a list of classes or class names (a class's "
                                   f"__name__ or 'module.QualName'); got {bad[0]!r} of type {type(bad[0]).__name__}")
    not_modules = [s for s in specs if isinstance(s, type) and not issubclass(s, torch.nn.Module)]
    if not_modules:   # (DeepSpeed: "No modules of type ... found", a ValueError, also with raise_if_not_found=False)
        raise ValueError(f"leaf_module_classes: {not_modules[0].__name__} is not a torch.nn.Module class; name the "
                         "module classes whose instances are leaf modules (e.g. the MoE block's)")
    matched = [m for m in model.modules() if any(_class_matches(m, s) for s in specs)]
    if not matched and raise_if_not_found:
        present = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(f"No modules of type {[getattr(s, '__name__', s) for s in specs]} found in the model "
                         f"(its module classes: {', '.join(present[:12])}{', ...' if len(present) > 12 else ''})")
    _flag(matched, flag)
    return matched


def set_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found=True):
    """Flag every module of `model` that is an instance of one of `leaf_module_classes` (classes, or class names:
    `__name__` or `module.QualName`) as a leaf module; returns them. None found: ValueError unless
    raise_if_not_found=False."""
    return _set_by_class(model, leaf_module_classes, True, raise_if_not_found)


def unset_z3_leaf_modules(model, leaf_module_classes, raise_if_not_found=True):
    """Clear the leaf flag of the modules set_z3_leaf_modules would flag; returns them."""
    return _set_by_class(model, leaf_module_classes, False, raise_if_not_found)


def set_z3_leaf_modules_by_name(model, module_names, flag=True, raise_if_not_found=True):
    """Flag the modules named (as in model.named_modules()); returns (modules, names not found)."""
    by_name = dict(model.named_modules())
    missing = [n for n in module_names if n not in by_name]
    if missing and raise_if_not_found:
        raise ValueError(f"No modules named {missing} found in the model (names as model.named_modules() gives "
                         f"them, e.g. {list(by_name)[1:4]})")
    matched = [by_name[n] for n in module_names if n in by_name]
    _flag(matched, flag)
    return matched, missing


def set_z3_leaf_modules_by_suffix(model, module_name_suffixes, flag=True, raise_if_not_found=True):
    """Flag the modules whose name ends with one of the suffixes; returns (modules, suffixes matching none)."""
    named = list(model.named_modules())
    matched, seen, missing = [], set(), []
    for suffix in module_name_suffixes:
        hits = [m for n, m in named if n.endswith(suffix)]
        if not hits:
            missing.append(suffix)
        for m in hits:
            if id(m) not in seen:
                seen.add(id(m))
                matched.append(m)
    if missing and raise_if_not_found:
        raise ValueError(f"No modules matching suffixes {missing} found in the model")
    _flag(matched, flag)
    return matched, missing


def apply_zero_leaf_module_config(model, leaf_cfg):
    """Flag the leaf modules zero_optimization.leaf_module names (classes, names, name_suffixes); returns them.
    Names or suffixes that match nothing are warned about when the config set them (the default classes, Hugging
    Face's MoE blocks, are simply absent from most models)."""
    if leaf_cfg is None:
        return []
    out, seen = [], set()

    def keep(modules):
        for m in modules:
            if id(m) not in seen:
                seen.add(id(m))
                out.append(m)

    keep(set_z3_leaf_modules(model, leaf_cfg.classes, raise_if_not_found=False) if leaf_cfg.classes else [])
    for setter, values, what in ((set_z3_leaf_modules_by_name, leaf_cfg.names, "names"),
                                 (set_z3_leaf_modules_by_suffix, leaf_cfg.name_suffixes, "name_suffixes")):
        if values:
            matched, missing = setter(model, values, raise_if_not_found=False)
            keep(matched)
            if missing:
                logger.warning(f"zero_optimization.leaf_module.{what}: {missing} match no module of the model")
    customised = leaf_cfg.classes != DEFAULT_LEAF_MODULE_CLASSES or leaf_cfg.names or leaf_cfg.name_suffixes
    if not out and customised:
        logger.warning("zero_optimization.leaf_module matched no module of the model; every module is hooked as "
                       "usual")
    return out


def _refuse_after_initialize(module, flag):
    from ..zero.params.hooks import hooked
    if hooked(module) and z3_leaf_module(module) != bool(flag):
        raise RuntimeError(f"{'set' if flag else 'unset'}_z3_leaf_modules on a {type(module).__name__} after "
                           "deepspeed.initialize placed the ZeRO stage 3 hooks: the leaf flags are read then; "
                           "call it before deepspeed.initialize")
