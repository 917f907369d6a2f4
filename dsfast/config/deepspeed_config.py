"""DeepSpeedConfig(config): DeepSpeed's config object over dsfast's validated config, for programs and tools that
build one themselves (`DeepSpeedConfig("ds_config.json").train_batch_size`, Hugging Face's config checks).

It validates exactly as `initialize()` does (the same errors, DsConfigError), resolves the batch sizes against the
data-parallel world size (the mpu's, else torch.distributed's, else 1), and answers DeepSpeed's attribute names; any
other top-level key of the schema (gradient_clipping, steps_per_print, ...) reads through. Attributes can be set, as
on DeepSpeed's object (tests set the batch sizes and call its checks); the dsfast config underneath is unchanged.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Union

from .ds_config import DsConfig
from .loader import load_config

# DeepSpeed's DeepSpeedConfig attribute -> how it is read from the DsConfig
_DEEPSPEED_NAMES = {
    "zero_config": lambda c: c.zero_optimization,
    "zero_optimization_stage": lambda c: c.zero_stage,
    "zero_enabled": lambda c: c.zero_stage > 0,
    "fp16_enabled": lambda c: c.fp16.enabled,
    "bfloat16_enabled": lambda c: c.bf16.enabled,
    "bfloat16_config": lambda c: c.bf16,
    "float16_config": lambda c: c.fp16,
    "torch_autocast_enabled": lambda c: c.torch_autocast.enabled,
    "optimizer_name": lambda c: None if c.optimizer is None else _optimizer_name(c.optimizer.type),
    "optimizer_params": lambda c: None if c.optimizer is None else _given(c, "optimizer").get("params"),
    "scheduler_name": lambda c: None if c.scheduler is None else c.scheduler.type,
    "scheduler_params": lambda c: None if c.scheduler is None else _given(c, "scheduler").get("params"),
    "checkpoint_tag_validation_enabled": lambda c: c.checkpoint.tag_validation != "Ignore",
    "checkpoint_tag_validation_fail": lambda c: c.checkpoint.tag_validation == "Fail",
}


def _optimizer_name(kind: str) -> str:
    # DeepSpeed lower-cases the names of its own optimizers and keeps any other name as given
    from ..runtime.config import DEEPSPEED_OPTIMIZERS
    return kind.lower() if kind.lower() in DEEPSPEED_OPTIMIZERS else kind


def _given(c: DsConfig, key: str) -> dict:
    section = c.raw.get(key) or {}
    return dict(section) if isinstance(section, Mapping) else {}


def _world_size(mpu) -> int:
    if mpu is not None:
        return int(mpu.get_data_parallel_world_size())
    import torch.distributed as dist
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class DeepSpeedConfig:
    """deepspeed.runtime.config.DeepSpeedConfig(config, mpu=None, mesh_device=None): `config` is a path to a JSON
    (or hjson) file or a dict."""

    def __init__(self, config: Union[str, os.PathLike, Mapping[str, Any]], mpu=None, mesh_device=None):
        if mesh_device is not None:
            raise NotImplementedError("DeepSpeedConfig(mesh_device=...): device meshes for tensor / sequence "
                                      "parallelism are not supported by dsfast")
        if not isinstance(config, (str, os.PathLike, Mapping)):
            raise TypeError(f"DeepSpeedConfig(config): expected a path to a ds_config file or a dict, got "
                            f"{type(config).__name__}")
        self.ds_config: DsConfig = load_config(config, world_size=_world_size(mpu), log_ignored=False)
        self._param_dict: dict = self.ds_config.raw      # the mapping as given (DeepSpeed keeps it under this name)
        self.world_size = self.ds_config.world_size
        self.train_batch_size = self.ds_config.train_batch_size
        self.train_micro_batch_size_per_gpu = self.ds_config.train_micro_batch_size_per_gpu
        self.gradient_accumulation_steps = self.ds_config.gradient_accumulation_steps

    def __getattr__(self, name: str):
        # only called for names not set on the instance: DeepSpeed's names, then the schema's top-level keys
        if name.startswith("__") or name == "ds_config":
            raise AttributeError(name)
        read = _DEEPSPEED_NAMES.get(name)
        if read is not None:
            return read(self.ds_config)
        if name in type(self.ds_config).model_fields:
            return getattr(self.ds_config, name)
        raise AttributeError(f"DeepSpeedConfig has no attribute {name!r} in dsfast (DeepSpeed's names here: "
                             f"{', '.join(sorted(_DEEPSPEED_NAMES))}, and the ds_config's top-level keys)")

    def __repr__(self) -> str:
        return f"DeepSpeedConfig({self._param_dict!r})"

