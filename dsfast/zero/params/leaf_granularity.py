"""zero_optimization.stage3_module_granularity_threshold: leaf modules chosen by size, as DeepSpeed 0.19.8 does.

A model of many tiny modules spends its stage 3 time in hooks and small gathers. A module's granularity is the
elements of its subtree's parameters divided by the modules counted in it (each torch leaf module with parameters
counts one, each module above them one more, containers none); walking from the root, the first modules whose
granularity is at most the threshold become leaf modules (gathered as a whole, nothing inside hooked:
param_hooks.py). Modules without parameters, torch leaf modules, containers (ModuleList, Sequential, ...: their
children may be called one by one) and subtrees over a billion elements never do.
"""
import torch

from ...utils.log import logger
from .partitioned_param import whole_numel

MAX_LEAF_ELEMENTS = 10 ** 9   # a bigger leaf would hold too much gathered at once
_NEVER = float("inf")
_CONTAINERS = frozenset(torch.nn.modules.container.__all__)   # by class name, as DeepSpeed tells them


def set_leaves_by_granularity(model, threshold):
    """Flag leaf modules by granularity (module._z3_leaf); returns them."""
    granularity = {}
    _measure(model, granularity)
    finite = [(g, m) for m, g in granularity.values() if g != _NEVER]
    if not finite or min(g for g, _ in finite) > threshold:
        smallest = min(finite, key=lambda t: t[0]) if finite else None
        logger.warning("zero_optimization.stage3_module_granularity_threshold=%s makes no leaf module: the smallest "
                       "granularity is %s%s", threshold, smallest[0] if smallest else "none (no module qualifies)",
                       f" ({type(smallest[1]).__name__})" if smallest else "")
        return []
    leaves = []
    _choose(model, granularity, threshold, leaves)
    for m in leaves:
        m._z3_leaf = True
    return leaves


def _measure(module, granularity):
    """(modules counted, elements) of `module`'s subtree; records its granularity by id."""
    own = sum(whole_numel(p) for p in module.parameters(recurse=False))
    children = list(module.children())
    if not children:
        granularity[id(module)] = (module, _NEVER)
        return (1 if own else 0), own
    layers, elements = 0, own
    for child in children:
        n, e = _measure(child, granularity)
        layers, elements = layers + n, elements + e
    if type(module).__name__ in _CONTAINERS or elements == 0:
        granularity[id(module)] = (module, _NEVER)
        return layers, elements
    layers += 1
    granularity[id(module)] = (module, elements // layers if elements <= MAX_LEAF_ELEMENTS else _NEVER)
    return layers, elements


def _choose(module, granularity, threshold, leaves):
    if granularity[id(module)][1] <= threshold:
        leaves.append(module)
        return
    for child in module.children():
        _choose(child, granularity, threshold, leaves)
