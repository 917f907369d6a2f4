"""Build the basic optimizer named in the config's `optimizer` section.

The one place that maps a DeepSpeed optimizer type to a class:
  Adam / AdamW -> dsfast CPUAdam on CPU, FusedAdam on GPU (decoupled weight decay unless `adam_w_mode: false`
                  for "Adam", as in DeepSpeed); `torch_adam: true` picks torch.optim.Adam/AdamW instead.
  SGD          -> dsfast CPUSGD on CPU, FusedSGD on GPU.
  Adagrad      -> dsfast CPUAdagrad (DeepSpeedCPUAdagrad) on CPU, torch.optim.Adagrad on GPU, as DeepSpeed.
  Lion         -> dsfast CPULion (DeepSpeedCPULion) on CPU; on GPU DeepSpeed's FusedLion, which dsfast lacks:
                  refused, naming offload_optimizer.
The CPU classes get fp32_optimizer_states as DeepSpeed's engine resolves it (config/master_precision.py); the GPU
ones keep their states in the (master) parameters' dtype.
"""
import inspect

import torch

SUPPORTED = ("adam", "adamw", "sgd", "adagrad", "lion")


class OptimizerConfigError(ValueError):
    """The `optimizer` section names a type or parameter we cannot build."""


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


def _adam_class(device_type, adamw_mode, torch_adam, states_8bit=False):
    if torch_adam:
        return (torch.optim.AdamW if adamw_mode else torch.optim.Adam), {}
    if states_8bit and device_type == "cpu":   # offload_optimizer.state_precision "int8" (checked by the config)
        from dsfast.optim.cpu_adam8bit import CPUAdam8bit
        return CPUAdam8bit, {"adamw_mode": adamw_mode}
    if device_type == "cuda":
        from dsfast.optim.fused_adam import FusedAdam
        return FusedAdam, {"adam_w_mode": adamw_mode}
    from dsfast.optim.cpu_adam import CPUAdam
    return CPUAdam, {"adamw_mode": adamw_mode}


def _sgd_class(device_type):
    if device_type == "cuda":
        from dsfast.optim.fused_sgd import FusedSGD
        return FusedSGD
    from dsfast.optim.cpu_sgd import CPUSGD
    return CPUSGD


def _adagrad_class(device_type):
    if device_type == "cuda":
        return torch.optim.Adagrad
    from dsfast.optim.cpu_adagrad import CPUAdagrad
    return CPUAdagrad


def _lion_class(device_type):
    if device_type == "cuda":
        raise OptimizerConfigError(
            'optimizer.type "Lion" on the GPU is DeepSpeed\'s FusedLion, which dsfast does not implement; set '
            'zero_optimization.offload_optimizer.device to "cpu" (DeepSpeedCPULion steps it on the host), or pass '
            "a Lion optimizer of your own to initialize(optimizer=...)")
    from dsfast.optim.cpu_lion import CPULion
    return CPULion


def build_optimizer(opt_cfg, param_groups, device, fp32_states=True, states_8bit=False):
    """The optimizer of a validated `optimizer` config section (dsfast.config.OptimizerConfig) over
    `param_groups` on `device`; fp32_states: the CPU optimizers' fp32_optimizer_states; states_8bit: Adam on the
    CPU keeps 8-bit block-wise moments (CPUAdam8bit)."""
    key = opt_cfg.type.lower()
    kwargs = opt_cfg.torch_kwargs()
    defaults = {k: f.default for k, f in type(opt_cfg.params).model_fields.items()}
    device_type = torch.device(device).type
    if key in ("adam", "adamw"):
        cls, extra = _adam_class(device_type, opt_cfg.adamw_mode, bool(opt_cfg.params.torch_adam), states_8bit)
        kwargs.update(extra)
    elif key == "sgd":
        cls = _sgd_class(device_type)
    elif key == "adagrad":
        cls = _adagrad_class(device_type)
    elif key == "lion":
        cls = _lion_class(device_type)
    else:
        raise OptimizerConfigError(
            f"optimizer.type {opt_cfg.type!r} is not supported; valid types: {', '.join(SUPPORTED)} "
            "(case-insensitive), or pass your own optimizer object to initialize(optimizer=...)")
    if states_8bit:   # the moments' precision is the config's int8, not this knob
        kwargs.pop("fp32_optimizer_states", None)
    kwargs = _fit_kwargs(cls, kwargs, defaults, opt_cfg.type)
    if "fp32_optimizer_states" in inspect.signature(cls.__init__).parameters:
        kwargs["fp32_optimizer_states"] = bool(fp32_states)
    return cls(param_groups, **kwargs)
