"""`zero_optimization` section: DeepSpeed's keys, aliases and defaults, all validated.

SUPPORTED_ZERO_STAGES is the ONE place that says which stages the engine can run (all of 0-3 today); everything
else here validates stages 1-3.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from .base import StrictModel, nested_error, plain_error

logger = logging.getLogger("dsfast.config")

# >>> The stages the engine implements. <<<
SUPPORTED_ZERO_STAGES = frozenset({0, 1, 2, 3})

_DEVICES = ("none", "cpu", "nvme")


def _device(v):
    if v is None:
        return "none"
    if not isinstance(v, str) or v.lower() not in _DEVICES:
        raise plain_error(f"must be one of {', '.join(repr(d) for d in _DEVICES)} (got {v!r})")
    return v.lower()


def _deprecated_pin(data) -> bool:
    """pin_memory for an offload made from the deprecated cpu_offload / cpu_offload_param keys: the offload
    sections' default (true), unless cpu_offload_use_pin_memory is given (DeepSpeed 0.19.8 ignores that key)."""
    given = data.get("cpu_offload_use_pin_memory")
    return True if given is None else bool(given)


class _OffloadTarget(StrictModel):
    """Where an offload goes: `device` none | cpu | nvme, and the directory that nvme needs."""
    device: str = "none"
    nvme_path: Optional[str] = None

    @field_validator("device", mode="before")
    @classmethod
    def _check_device(cls, v):
        return _device(v)

    @model_validator(mode="after")
    def _nvme_needs_path(self):
        if self.device == "nvme" and not self.nvme_path:
            raise plain_error('device "nvme" needs "nvme_path" (a directory on a fast local disk)')
        return self


class OffloadOptimizerConfig(_OffloadTarget):
    """device may also be "auto": initialize() picks none, cpu or nvme from the offload plan
    (zero/planning/auto_offload.py)."""
    buffer_count: int = Field(4, ge=0)
    pin_memory: bool = True          # DeepSpeed's default since 0.19.5 (false before); only CUDA pins
    pipeline_read: bool = False
    pipeline_write: bool = False
    fast_init: bool = False
    ratio: float = Field(1.0, ge=0.0, le=1.0)   # < 1: offload only part of the states (stage 3 only)
    super_offload: bool = False
    cpuadam_cores_perc: float = Field(0.8, ge=0.0, le=1.0)
    # dsfast's own key: the precision of the host optimizer's Adam moments. "fp32" (default: as bf16.* set them) or
    # "int8" (alias "8bit"): 8-bit block-wise moments, dsfast.optim.CPUAdam8bit (config/master_precision.py's rules)
    state_precision: str = "fp32"
    # dsfast's own key: the host step runs in a worker after engine.step() returns (config/overlap_step.py's rules)
    overlap_step: bool = False

    @field_validator("overlap_step", mode="before")
    @classmethod
    def _check_overlap_step(cls, v):
        if not isinstance(v, bool):   # (pydantic would read "yes" or 1 as true)
            raise plain_error(f"must be true or false (got {v!r})")
        return v

    @field_validator("state_precision", mode="before")
    @classmethod
    def _check_state_precision(cls, v):
        names = {"fp32": "fp32", "int8": "int8", "8bit": "int8"}
        if not isinstance(v, str) or v.lower() not in names:
            raise plain_error(f"must be one of 'fp32', 'int8' (alias '8bit') (got {v!r})")
        return names[v.lower()]

    @field_validator("device", mode="before")
    @classmethod
    def _check_device(cls, v):
        if isinstance(v, str) and v.lower() == "auto":
            return "auto"
        try:
            return _device(v)
        except ValueError:
            raise plain_error(f"must be one of {', '.join(repr(d) for d in _DEVICES)} or 'auto' (dsfast picks one "
                              f"from the machine's memory at initialize) (got {v!r})") from None

    @property
    def pipeline(self) -> bool:
        """DeepSpeed's derived flag (DeepSpeedZeroOffloadOptimizerConfig.pipeline): either pipelining option."""
        return self.pipeline_read or self.pipeline_write


class OffloadParamConfig(_OffloadTarget):
    buffer_count: int = Field(5, ge=0)
    buffer_size: int = Field(100_000_000, ge=0)
    max_in_cpu: int = Field(1_000_000_000, ge=0)
    pin_memory: bool = True          # DeepSpeed's default since 0.19.5 (false before); only CUDA pins


# DeepSpeed 0.19.8's leaf_module.classes: Hugging Face's MoE blocks, leaf modules whenever a model has them
DEFAULT_LEAF_MODULE_CLASSES = [
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
]


class LeafModuleConfig(StrictModel):
    """Stage 3 leaf modules, gathered as a whole (dsfast.utils.z3_leaf_module): by class (`__name__` or
    'module.QualName'), by name in named_modules(), by name suffix. A single string is a list of one, as in
    DeepSpeed; duplicates are dropped."""
    classes: List[str] = Field(default_factory=lambda: list(DEFAULT_LEAF_MODULE_CLASSES))
    names: List[str] = Field(default_factory=list)
    name_suffixes: List[str] = Field(default_factory=list)

    @field_validator("classes", "names", "name_suffixes", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @field_validator("classes", "names", "name_suffixes")
    @classmethod
    def _unique(cls, v):
        return list(dict.fromkeys(v))


class ZeroConfig(StrictModel):
    stage: int = Field(0, ge=0, le=3)
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size: int = Field(500_000_000, gt=0)
    use_multi_rank_bucket_allreduce: bool = True
    allgather_partitions: bool = True
    allgather_bucket_size: int = Field(500_000_000, ge=0)
    overlap_comm: Optional[bool] = None          # None -> True for stage 3, False otherwise (_overlap_comm_default)
    load_from_fp32_weights: bool = True
    elastic_checkpoint: bool = False
    sub_group_size: int = Field(1_000_000_000, ge=0)
    round_robin_gradients: bool = False
    ignore_unused_parameters: bool = True
    compute_grad_norm: bool = True
    offload_optimizer: Optional[OffloadOptimizerConfig] = None
    offload_param: Optional[OffloadParamConfig] = None
    # Stage-3 knobs; each also accepts DeepSpeed's `stage3_` spelling.
    prefetch_bucket_size: int = Field(50_000_000, ge=0, alias="stage3_prefetch_bucket_size")
    param_persistence_threshold: int = Field(100_000, ge=0, alias="stage3_param_persistence_threshold")
    model_persistence_threshold: int = Field(2**63 - 1, ge=0, alias="stage3_model_persistence_threshold")
    max_live_parameters: int = Field(1_000_000_000, ge=0, alias="stage3_max_live_parameters")
    max_reuse_distance: int = Field(1_000_000_000, ge=0, alias="stage3_max_reuse_distance")
    gather_16bit_weights_on_model_save: bool = Field(False, alias="stage3_gather_16bit_weights_on_model_save")
    module_granularity_threshold: int = Field(0, ge=0, alias="stage3_module_granularity_threshold")
    use_all_reduce_for_fetch_params: bool = Field(False, alias="stage3_use_all_reduce_for_fetch_params")
    allgather_sequential: bool = Field(False, alias="stage3_allgather_sequential")
    # ZeRO++ / MiCS
    zero_hpz_partition_size: int = Field(1, ge=1)
    zero_quantized_weights: bool = False
    zero_quantized_nontrainable_weights: bool = False
    zero_quantized_gradients: bool = False
    _world_for_notes: int = PrivateAttr(1)     # the world size ZeRO++'s notes speak of (config/zeropp.py)
    mics_shard_size: int = Field(-1, ge=-1)
    mics_hierarchical_params_gather: bool = False
    memory_efficient_linear: bool = True
    pipeline_loading_checkpoint: bool = False
    override_module_apply: bool = True
    log_trace_cache_warnings: bool = False
    legacy_stage1: bool = False
    parameter_alignment: bool = False
    enable_sanity_checks: bool = False
    save_muon_momentum_buffer_in_memory: bool = False
    leaf_module: LeafModuleConfig = Field(default_factory=LeafModuleConfig)
    zenflow: Optional[Dict[str, Any]] = None    # ZenFlow (DeepSpeed 0.18+): rejected below
    # Deprecated DeepSpeed spellings, mapped onto the keys above in _map_deprecated.
    cpu_offload: Optional[bool] = None
    cpu_offload_param: Optional[bool] = None
    cpu_offload_use_pin_memory: Optional[bool] = None
    stage3_gather_fp16_weights_on_model_save: Optional[bool] = None

    @field_validator("zenflow")
    @classmethod
    def _no_zenflow(cls, v):
        if v:
            raise plain_error("ZenFlow (stall-free offloading) is not supported by dsfast; remove \"zenflow\"")
        return v

    @field_validator("stage")
    @classmethod
    def _stage_supported(cls, v):
        # The single gate on ZeRO stages (see SUPPORTED_ZERO_STAGES above); never fall back to stage 0 silently.
        if v not in SUPPORTED_ZERO_STAGES:
            raise plain_error(
                f"ZeRO stage {v} is not supported by dsfast yet: stages "
                f"{', '.join(str(s) for s in sorted(SUPPORTED_ZERO_STAGES))} run today (stage 3, parameter "
                'partitioning, lands in a later release). Set "zero_optimization": {"stage": 2} (gradients and '
                "optimizer states partitioned) or a lower stage")
        return v

    @model_validator(mode="before")
    @classmethod
    def _map_deprecated(cls, data: Any):
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("cpu_offload"):
            if data.get("offload_optimizer") is not None:
                raise plain_error('"cpu_offload" (deprecated) and "offload_optimizer" are both set; keep only '
                                  '"offload_optimizer": {"device": "cpu"}')
            logger.warning('zero_optimization.cpu_offload is deprecated; using "offload_optimizer": '
                           '{"device": "cpu"}')
            data["offload_optimizer"] = {"device": "cpu", "pin_memory": _deprecated_pin(data)}
        if data.get("cpu_offload_param"):
            if data.get("offload_param") is not None:
                raise plain_error('"cpu_offload_param" (deprecated) and "offload_param" are both set; keep only '
                                  '"offload_param": {"device": "cpu"}')
            logger.warning('zero_optimization.cpu_offload_param is deprecated; using "offload_param": '
                           '{"device": "cpu"}')
            data["offload_param"] = {"device": "cpu", "pin_memory": _deprecated_pin(data)}
        old = data.get("stage3_gather_fp16_weights_on_model_save")
        if old is not None:
            if "gather_16bit_weights_on_model_save" in data or "stage3_gather_16bit_weights_on_model_save" in data:
                raise plain_error('"stage3_gather_fp16_weights_on_model_save" (deprecated) and '
                                  '"stage3_gather_16bit_weights_on_model_save" are both set; keep the second')
            data["gather_16bit_weights_on_model_save"] = old
        # A knob given under both its names is ambiguous.
        for name, field in cls.model_fields.items():
            if field.alias and name in data and field.alias in data:
                raise plain_error(f'"{name}" and its alias "{field.alias}" are both set; keep one')
        return data

    @model_validator(mode="after")
    def _elastic_checkpoint_at_stage3(self):
        # DeepSpeed 0.19.8 warns through its one logger (deepspeed.utils.logger, "dsfast.program" here: the same
        # object) that elastic checkpoints are deprecated at stage 3; dsfast's checkpoints load at any world size
        if self.elastic_checkpoint and self.stage == 3:
            logging.getLogger("dsfast.program").warning(
                "zero_optimization.elastic_checkpoint: elastic checkpointing is deprecated and has no effect at ZeRO "
                "stage 3 (dsfast's checkpoints load at any world size and stage without it); remove the key")
        return self

    @model_validator(mode="after")
    def _overlap_comm_default(self):
        # DeepSpeed's DeepSpeedZeroConfig resolves the unset key on the object itself: True at stage 3 only
        if self.overlap_comm is None:
            self.overlap_comm = self.stage == 3
        return self

    def offload_stage_errors(self):
        """The offload sections that need a ZeRO stage, at stage 0: checked by the whole config (DsConfig), not
        here, since DeepSpeed's DeepSpeedZeroConfig builds them at any stage (its default is stage 0)."""
        if self.stage != 0:
            return []
        if self.offload_optimizer_device == "auto":
            return [(("zero_optimization", "offload_optimizer", "device"), '"auto" picks where the optimizer states '
                     "of ZeRO stage 1, 2 or 3 go (stage is 0); set a stage or remove the section")]
        if self.offload_optimizer is not None and self.offload_optimizer.device != "none":
            return [(("zero_optimization", "offload_optimizer"), "offloading optimizer states needs ZeRO stage 1, "
                     "2 or 3 (stage is 0)")]
        return []

    @model_validator(mode="after")
    def _offload_sections(self):
        # NVMe runs for the optimizer's states at stages 1-3 (zero/nvme/states.py), for stage 3's parameter
        # shards (zero/nvme/params.py)
        if self.offload_optimizer_device == "nvme" and self.offload_optimizer.buffer_count < 1:
            raise nested_error([(("offload_optimizer", "buffer_count"), "NVMe offload needs at least 1 host "
                                                                        "buffer (3 or more overlap reading, the "
                                                                        "step and writing)")])
        if self.offload_param_device == "nvme" and self.offload_param.buffer_count < 2:
            raise nested_error([(("offload_param", "buffer_count"), "NVMe offload of parameters needs at least 2 "
                                                                    "host buffers (one read ahead while one is "
                                                                    "used; DeepSpeed's default is 5)")])
        if self.offload_optimizer is not None and self.offload_optimizer.ratio < 1.0:
            raise nested_error([(("offload_optimizer", "ratio"), "ratio < 1 (partial offload, a ZeRO stage 3 "
                                                                 "option) is not supported by dsfast; use 1.0")])
        if not self.compute_grad_norm and self.stage not in (1, 2):
            raise nested_error([(("compute_grad_norm",), "false is supported only with ZeRO stage 1 or 2")])
        return self

    @model_validator(mode="after")
    def _zeropp_by_meaning(self, info: ValidationInfo):
        # ZeRO++: accepted where it means the same as off, refused by key otherwise (config/zeropp.py)
        from .zeropp import zeropp_errors
        errors = zeropp_errors(self, int((info.context or {}).get("world_size", 1)))
        if errors:
            raise nested_error(errors)
        self._world_for_notes = int((info.context or {}).get("world_size", 1))
        return self

    @property
    def overlap_comm_resolved(self) -> bool:
        return self.stage == 3 if self.overlap_comm is None else self.overlap_comm

    @property
    def offload_optimizer_device(self) -> str:
        return self.offload_optimizer.device if self.offload_optimizer else "none"

    @property
    def offload_param_device(self) -> str:
        # DeepSpeed offloads parameters only at stage 3 (the stage that partitions them) and ignores the section
        # at stages 0-2; so does dsfast, and says so (DsConfig.ignored_settings)
        return self.offload_param.device if self.offload_param and self.stage == 3 else "none"

    def ignored(self) -> List[str]:
        from .zeropp import zeropp_note
        note = zeropp_note(self, self._world_for_notes)
        return [note] if note else []
