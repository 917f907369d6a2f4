"""deepspeed.runtime paths that programs import directly (lr_schedules, utils, zero, engine, config); the engine
itself is dsfast.engine. Submodules also load on attribute access (`deepspeed.runtime.lr_schedules.X` after a plain
`import deepspeed`, as Hugging Face's accelerate does)."""
import importlib

_SUBMODULES = ("lr_schedules", "utils", "zero", "engine", "config", "base_optimizer", "fp16", "checkpoint_engine",
               "sequence_parallel", "pipe", "swap_tensor", "bf16_optimizer", "activation_checkpointing", "config_utils")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
