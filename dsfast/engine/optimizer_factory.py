"""Build the basic optimizer named in the config's `optimizer` section.

The one place that maps a DeepSpeed optimizer type to a class:
  Adam / AdamW -> dsfast CPUAdam on CPU, FusedAdam on GPU (decoupled weight decay unless `adam_w_mode: false`
                  for "Adam", as in DeepSpeed); `torch_adam: true` picks torch.optim.Adam/AdamW instead.
  SGD          -> dsfast CPUSGD on CPU, FusedSGD on GPU.
If a dsfast optimizer module is not present in this build, the torch.optim equivalent is used (with a warning).
"""
import importlib
import inspect
import warnings

import torch

SUPPORTED = ("adam", "adamw", "sgd")


class OptimizerConfigError(ValueError):
    """The `optimizer` section names a type or parameter we cannot build."""


def _dsfast_class(module, name):
    """dsfast.optim.<module>.<name>, or None when that module is not in this build."""
    try:
        return getattr(importlib.import_module(f"dsfast.optim.{module}"), name)
    except ModuleNotFoundError as err:
        if err.name != f"dsfast.optim.{module}":
            raise
        return None


def _fit_kwargs(cls, kwargs, defaults, type_name):
    """Keep the config params `cls` accepts; one it lacks is dropped when it holds the schema default and an
    error (naming the key and the class) when it was set to something else."""
    sig = inspect.signature(cls.__init__)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return kwargs
    out = {}
    for key, value in kwargs.items():
        if key in sig.parameters:
            out[key] = value
        elif defaults.get(key, object()) != value:
            raise OptimizerConfigError(
                f"optimizer.params.{key}={value!r} (type {type_name!r}) is not supported by "
                f"{cls.__module__}.{cls.__name__}; remove it or use its default {defaults.get(key)!r}")
    return out


def _adam_class(device_type, adamw_mode, torch_adam):
    if torch_adam:
        return (torch.optim.AdamW if adamw_mode else torch.optim.Adam), {}
    if device_type == "cuda":
        cls = _dsfast_class("fused_adam", "FusedAdam")
        if cls is not None:
            return cls, {"adam_w_mode": adamw_mode}
    else:
        cls = _dsfast_class("cpu_adam", "CPUAdam")
        if cls is not None:
            return cls, {"adamw_mode": adamw_mode}
    warnings.warn("dsfast's Adam kernels are not in this build; using torch.optim "
                  + ("AdamW" if adamw_mode else "Adam"))
    return (torch.optim.AdamW if adamw_mode else torch.optim.Adam), {}


def _sgd_class(device_type):
    name, module = ("FusedSGD", "fused_sgd") if device_type == "cuda" else ("CPUSGD", "cpu_sgd")
    cls = _dsfast_class(module, name)
    if cls is None:
        warnings.warn(f"dsfast's {name} is not in this build; using torch.optim.SGD")
        return torch.optim.SGD
    return cls


def build_optimizer(opt_cfg, param_groups, device):
    """The optimizer of a validated `optimizer` config section (dsfast.config.OptimizerConfig) over
    `param_groups` on `device`."""
    key = opt_cfg.type.lower()
    kwargs = opt_cfg.torch_kwargs()
    defaults = {k: f.default for k, f in type(opt_cfg.params).model_fields.items()}
    device_type = torch.device(device).type
    if key in ("adam", "adamw"):
        cls, extra = _adam_class(device_type, opt_cfg.adamw_mode, bool(opt_cfg.params.torch_adam))
        kwargs.update(extra)
    elif key == "sgd":
        cls = _sgd_class(device_type)
    else:
        raise OptimizerConfigError(
            f"optimizer.type {opt_cfg.type!r} is not supported; valid types: {', '.join(SUPPORTED)} "
            "(case-insensitive), or pass your own optimizer object to initialize(optimizer=...)")
    return cls(param_groups, **_fit_kwargs(cls, kwargs, defaults, opt_cfg.type))
