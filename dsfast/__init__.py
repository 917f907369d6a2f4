"""dsfast: a small, fast, DeepSpeed-compatible training library for PyTorch.

`import dsfast as deepspeed` is meant to work. Heavy pieces load lazily so that
importing the package never builds or loads a native op.
"""
import importlib
import sys

if __name__ != "dsfast":
    # loaded under another name (a `deepspeed` symlink to this package): be the one dsfast. Done first, so that
    # the relative imports below resolve through the alias finder to dsfast's modules, not to copies of them.
    try:
        sys.modules[__name__] = importlib.import_module("dsfast")
    except ImportError:
        pass

from . import _alias
from .version import API_LEVEL as _API_LEVEL, DEEPSPEED_VERSION as __version__

# DeepSpeed's version attributes (version.py says why they give DeepSpeed's API level); a DeepSpeed installed from
# PyPI reports "unknown" for the git fields too
__version_major__, __version_minor__, __version_patch__ = (int(p) for p in _API_LEVEL.split("."))
__git_hash__ = __git_branch__ = "unknown"

_alias.install()

# public name -> module that defines it (imported on first attribute access)
_LAZY = {
    "initialize": "dsfast.engine",
    "init_inference": "dsfast.inference",
    "InferenceEngine": "dsfast.inference",
    "init_distributed": "dsfast.comm",
    "add_config_arguments": "dsfast.engine",
    "DeepSpeedEngine": "dsfast.engine",
    "Engine": "dsfast.engine",
    "optim": "dsfast.optim",
    "ops": "dsfast.ops",
    "utils": "dsfast.utils",
    "zero": "dsfast.zero",
    "accelerator": "dsfast.accelerator",
    "get_accelerator": "dsfast.accelerator",
    "comm": "dsfast.comm",
    "moe": "dsfast.moe",
    "checkpoint": "dsfast.checkpoint",
    "checkpointing": "dsfast.checkpointing",
    "runtime": "dsfast.runtime",
    "profiling": "dsfast.profiling",
    "log_dist": "dsfast.utils",
    "logger": "dsfast.utils",
    "OnDevice": "dsfast.utils",
    "default_inference_config": "dsfast.inference",
    "DeepSpeedOptimizer": "dsfast.runtime.base_optimizer",
    "git_version_info": "dsfast.git_version_info",
    "DeepSpeedOptimizerCallable": "dsfast.runtime.engine",
    "DeepSpeedSchedulerCallable": "dsfast.runtime.engine",
    # importable, refused when used (dsfast has neither pipeline parallelism nor kernel injection)
    "pipe": "dsfast.pipe",
    "PipelineModule": "dsfast.pipe",
    "module_inject": "dsfast.module_inject",
    "DeepSpeedConfig": "dsfast.runtime.config",
    "DeepSpeedConfigError": "dsfast.runtime.config",
}
TORCH_DISTRIBUTED_DEFAULT_PORT = 29500

# DeepSpeed names for what dsfast does not do: an AttributeError that says so (hasattr() stays False)
_NOT_SUPPORTED = {
    "PipelineEngine": "pipeline parallelism", "DualPipeVEngine": "pipeline parallelism",
    "DualPipeVModule": "pipeline parallelism", "DeepSpeedHybridEngine": "the hybrid (RLHF) engine",
    "DeepSpeedTransformerLayer": "DeepSpeed's fused transformer layer",
    "DeepSpeedTransformerConfig": "DeepSpeed's fused transformer layer",
    "replace_transformer_layer": "kernel injection",
    "tp_model_init": "tensor parallelism", "set_autotp_mode": "tensor parallelism",
    "elasticity": "elastic training (DeepSpeed 0.19.8 removed it too)",
}


def is_compile_supported():
    """Whether this torch can compile a module (DeepSpeed's check; its unit tests skip on it at import)."""
    import torch
    return hasattr(torch, "compiler") and hasattr(torch.nn.Module, "compile")


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        if name in _NOT_SUPPORTED:
            raise AttributeError(f"deepspeed.{name} ({_NOT_SUPPORTED[name]}) is not supported by dsfast")
        raise AttributeError(f"module 'dsfast' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module == f"dsfast.{name}" else getattr(mod, name)
    globals()[name] = value
    return value


__all__ = ["__version__", "TORCH_DISTRIBUTED_DEFAULT_PORT", "is_compile_supported", *_LAZY]
