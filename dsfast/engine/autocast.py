"""DeepSpeed 0.19's `torch_autocast` section: how the engine's forward runs under torch.autocast.

DeepSpeed's semantics (runtime/torch_autocast.py, engine.py), which the engine follows:
- forward runs inside torch.autocast(device_type, dtype); weights keep their dtype (fp32 normally), so autograd
  accumulates fp32 gradients and the optimizer steps fp32 parameters directly (no master copy for autocast);
- with torch_autocast disabled, a torch.autocast the user opened around engine(...) is switched off for the
  engine's forward (the engine follows its own config: fp16/bf16 sections or fp32);
- float16 at ZeRO stage 0 needs a torch.amp.GradScaler: backward scales the loss, step unscales (before
  clipping), skips a step with inf/nan gradients and updates the scale;
- lower_precision_safe_modules marks the parameters of those exact classes with `comm_dtype`: ZeRO 1-3 reduce
  their gradients in the autocast dtype. Stage 0 reduces in the parameters' dtype (DeepSpeed too).
Deliberate difference: dtype unset means torch's default for the device (float16 on CUDA), and a float16 plan
always wants the GradScaler (DeepSpeed creates it only when "fp16" is spelt out, and then can underflow).
"""
import contextlib
import importlib
import logging
from dataclasses import dataclass
from typing import ContextManager, Optional, Tuple

import torch

from dsfast.config.errors import raise_problems

log = logging.getLogger("dsfast")

# DeepSpeed's default list (torch_autocast.LOWER_PRECISION_SAFE_MODULES)
DEFAULT_LOWER_PRECISION_SAFE_MODULES = ("torch.nn.Linear", "torch.nn.Conv1d", "torch.nn.Conv2d", "torch.nn.Conv3d")
COMM_DTYPE_ATTR = "comm_dtype"   # DeepSpeed's attribute name on marked parameters
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_KEY = "torch_autocast.lower_precision_safe_modules"

_warned_outer_autocast = False


def resolve_module_classes(names) -> Tuple[type, ...]:
    """'torch.nn.Linear' -> torch.nn.Linear for each name; every name that does not resolve is reported."""
    problems, classes = [], []
    for i, name in enumerate(names):
        module_name, _, class_name = name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except ImportError as err:
            problems.append((f"{_KEY}[{i}]", f"{name!r} cannot be imported ({type(err).__name__}: {err})"))
            continue
        except AttributeError:
            problems.append((f"{_KEY}[{i}]", f"{name!r}: module {module_name!r} has no {class_name!r}"))
            continue
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            problems.append((f"{_KEY}[{i}]", f"{name!r} is not a torch.nn.Module class (got {cls!r})"))
            continue
        classes.append(cls)
    if problems:
        raise_problems(problems)
    return tuple(classes)


@dataclass(frozen=True)
class AutocastPlan:
    enabled: bool
    device_type: str
    dtype: Optional[torch.dtype]            # None when disabled
    safe_module_classes: Tuple[type, ...]   # empty when disabled

    def forward_context(self) -> ContextManager:
        """A fresh context manager for one forward pass (what engine.forward enters around module(...))."""
        if self.enabled:
            return torch.autocast(device_type=self.device_type, dtype=self.dtype)
        if torch.is_autocast_enabled(self.device_type):
            _warn_outer_autocast_once()
            return torch.autocast(device_type=self.device_type, enabled=False)
        return contextlib.nullcontext()

    @property
    def needs_grad_scaler(self) -> bool:
        return self.enabled and self.dtype == torch.float16

    def grad_scaler(self):
        """The loss scaler a float16 plan trains with (torch's defaults, as DeepSpeed); None otherwise."""
        return torch.amp.GradScaler(device=self.device_type) if self.needs_grad_scaler else None

    def mark_lower_precision_params(self, module: torch.nn.Module):
        """Set `comm_dtype` on the parameters of modules whose class is exactly one of safe_module_classes
        (DeepSpeed matches the class itself, not subclasses); returns those parameters."""
        marked = []
        for sub in module.modules():
            if type(sub) in self.safe_module_classes:
                for p in sub.parameters(recurse=False):
                    setattr(p, COMM_DTYPE_ATTR, self.dtype)
                    marked.append(p)
        return marked


def _warn_outer_autocast_once():
    global _warned_outer_autocast
    if not _warned_outer_autocast:
        _warned_outer_autocast = True
        log.warning("torch.autocast is enabled around the engine but torch_autocast is disabled in the ds_config: "
                    "the engine's forward runs without autocast (as DeepSpeed). To use torch's autocast, enable the "
                    '"torch_autocast" section instead')


def autocast_plan(config, device) -> AutocastPlan:
    """The plan for a parsed DsConfig on `device` (a torch.device or "cuda:0" / "cpu")."""
    section = config.torch_autocast
    device_type = torch.device(device).type
    if not section.enabled:
        return AutocastPlan(False, device_type, None, ())
    dtype = _DTYPES[section.dtype] if section.dtype else torch.get_autocast_dtype(device_type)
    names = section.lower_precision_safe_modules
    classes = resolve_module_classes(DEFAULT_LOWER_PRECISION_SAFE_MODULES if names is None else names)
    return AutocastPlan(True, device_type, dtype, classes)
