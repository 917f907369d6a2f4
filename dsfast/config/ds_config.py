"""DsConfig: the whole ds_config.json as one typed pydantic schema (DeepSpeed's keys and defaults)."""
from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Optional, Union

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from .base import StrictModel, nested_error, plain_error
from .batch import BatchSizeError, resolve_batch_sizes
from .extras import (IGNORED_SECTIONS, UNSUPPORTED_FEATURES, ActivationCheckpointingConfig, CheckpointConfig, CometConfig,
                     CommsLoggerConfig, CompileConfig, CsvMonitorConfig, DataTypesConfig, FlopsProfilerConfig,
                     HangWatchConfig, TensorboardConfig, TimersConfig, WandbConfig, check_unsupported_feature,
                     aio_notes, check_aio, normalize_dtype)
from .master_precision import master_precision_errors
from .overlap_step import overlap_step_errors
from .optimizer import OptimizerConfig
from .precision import AmpConfig, Bf16Config, Fp16Config, TorchAutocastConfig
from .scheduler import SchedulerConfig
from .zero import SUPPORTED_ZERO_STAGES, ZeroConfig


# Valid settings the engine does not act on yet -> a warning when set to a non-default value. When the engine
# implements one, delete its line here (this is the one place to change).
NOT_YET_HONOURED = {
    "prescale_gradients": "dsfast averages gradients in one step; only rounding could differ",
    "gradient_predivide_factor": "dsfast averages gradients in one step; only rounding could differ",
    "zero_optimization.max_reuse_distance": "stage 3 releases a module's parameters after its forward",
    "zero_optimization.allgather_bucket_size": "parameters are all-gathered per reduction bucket "
                                               "(reduce_bucket_size, at most 1M elements)",
    "checkpoint.load_universal": "dsfast checkpoints load at any world size and stage without conversion",
    "checkpoint.use_node_local_storage": "every rank writes its shards into the one save_dir",
    "checkpoint.checkpoint_serialization": "dsfast's checkpoints are safetensors files; only a "
                                           "TorchCheckpointEngine built from this config reads it",
}


class DsConfig(StrictModel):
    # --- batch (resolved against the world size after validation; always ints afterwards) ---
    train_batch_size: Optional[int] = Field(None, ge=1)
    train_micro_batch_size_per_gpu: Optional[int] = Field(None, ge=1)
    gradient_accumulation_steps: Optional[int] = Field(None, ge=1)
    # --- optimization ---
    optimizer: Optional[OptimizerConfig] = None
    scheduler: Optional[SchedulerConfig] = None
    # max global L2 norm; 0 disables clipping. DeepSpeed's default is 1.0 since 0.19.3 (0.0 before)
    gradient_clipping: float = Field(1.0, ge=0)
    prescale_gradients: bool = False                  # divide grads before the all-reduce instead of after
    gradient_predivide_factor: float = Field(1.0, gt=0)
    zero_allow_untested_optimizer: bool = False
    zero_force_ds_cpu_optimizer: bool = True
    # --- precision ---
    fp16: Fp16Config = Field(default_factory=Fp16Config)
    bf16: Bf16Config = Field(default_factory=Bf16Config, alias="bfloat16")
    amp: AmpConfig = Field(default_factory=AmpConfig)
    torch_autocast: TorchAutocastConfig = Field(default_factory=TorchAutocastConfig)
    communication_data_type: Optional[str] = None
    seq_parallel_communication_data_type: Optional[str] = None
    data_types: DataTypesConfig = Field(default_factory=DataTypesConfig)
    # --- ZeRO ---
    zero_optimization: ZeroConfig = Field(default_factory=ZeroConfig)
    # --- logging / data / checkpoints ---
    steps_per_print: Optional[int] = Field(10, ge=1)  # null: never print progress
    wall_clock_breakdown: bool = False
    memory_breakdown: bool = False
    dump_state: bool = False
    dataloader_drop_last: bool = False
    sparse_gradients: bool = False
    disable_allgather: bool = False
    disable_python_gc: Union[bool, int] = False       # true: cyclic GC off while the engine lives (engine/python_gc.py)
    managed_gradient_accumulation: bool = True
    gradient_allreduce_op: str = "mean"              # DeepSpeed 0.19: "mean" | "sum"
    log_level: Optional[str] = None
    sequence_parallel_size: int = Field(1, ge=1)
    use_data_before_expert_parallelism: bool = False
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    hang_watch: HangWatchConfig = Field(default_factory=HangWatchConfig)   # dsfast's own section
    # --- accepted, reported as ignored when enabled ---
    activation_checkpointing: ActivationCheckpointingConfig = Field(default_factory=ActivationCheckpointingConfig)
    flops_profiler: FlopsProfilerConfig = Field(default_factory=FlopsProfilerConfig)
    tensorboard: TensorboardConfig = Field(default_factory=TensorboardConfig)
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    csv_monitor: CsvMonitorConfig = Field(default_factory=CsvMonitorConfig)
    comet: CometConfig = Field(default_factory=CometConfig)
    comms_logger: CommsLoggerConfig = Field(default_factory=CommsLoggerConfig)
    compile: CompileConfig = Field(default_factory=CompileConfig)
    timers: TimersConfig = Field(default_factory=TimersConfig)
    # --- DeepSpeed features dsfast lacks: an error when enabled (see extras.UNSUPPORTED_FEATURES) ---
    pipeline: Any = None
    sparse_attention: Any = None
    compression_training: Any = None
    curriculum_learning: Any = None
    data_efficiency: Any = None
    elasticity: Any = None
    autotuning: Any = None
    quantize_training: Any = None
    eigenvalue: Any = None
    progressive_layer_drop: Any = None
    hybrid_engine: Any = None
    weight_quantization: Any = None
    tensor_parallel: Any = None
    expert_parallel: Any = None
    graph_harvesting: Any = None
    # --- I/O tuning for features dsfast lacks: accepted with a warning (see extras.IGNORED_SECTIONS) ---
    aio: Optional[Dict[str, Any]] = None
    nebula: Optional[Dict[str, Any]] = None

    _world_size: int = PrivateAttr(1)
    _source: Optional[str] = PrivateAttr(None)
    _raw: Optional[dict] = PrivateAttr(None)

    # ----------------------------------------------------------------------------------------------- validators
    @field_validator("aio", mode="before")
    @classmethod
    def _aio_numbers(cls, v):
        return check_aio(v)

    @model_validator(mode="before")
    @classmethod
    def _bf16_alias_once(cls, data: Any):
        if isinstance(data, dict) and "bf16" in data and "bfloat16" in data:
            raise plain_error('"bf16" and its alias "bfloat16" are both set; keep one')
        return data

    @field_validator("zero_optimization", mode="before")
    @classmethod
    def _zero_bool(cls, v):
        # DeepSpeed's legacy form: true means stage 1, false stage 0.
        if isinstance(v, bool):
            return {"stage": 1 if v else 0}
        return {} if v is None else v

    @field_validator("gradient_clipping")
    @classmethod
    def _finite_clip(cls, v):
        if not math.isfinite(v):
            raise plain_error(f"must be a finite number >= 0; 0 disables clipping (got {v!r})")
        return v

    @field_validator("steps_per_print", mode="before")
    @classmethod
    def _never(cls, v):
        # Hugging Face's Trainer passes float("inf") (never print), which DeepSpeed's modulo test accepts
        return None if isinstance(v, float) and v == float("inf") else v

    @field_validator("communication_data_type", "seq_parallel_communication_data_type", mode="before")
    @classmethod
    def _dtype(cls, v):
        return normalize_dtype(v)

    @field_validator("gradient_allreduce_op", mode="before")
    @classmethod
    def _allreduce_op(cls, v):
        if v == "sum":
            raise plain_error('"sum" (summed instead of averaged gradients) is not supported by dsfast; dsfast '
                              'averages over ranks as DeepSpeed does by default: use "mean" or remove the key')
        if v != "mean":
            raise plain_error(f'must be "mean" (got {v!r})')
        return v

    @field_validator("sequence_parallel_size")
    @classmethod
    def _no_sp(cls, v):
        if v != 1:
            raise plain_error(f"sequence parallelism is not supported by dsfast (got {v}); remove the key or use 1")
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, v):
        valid = ("debug", "info", "warning", "error", "critical")
        if v is not None and (not isinstance(v, str) or v.lower() not in valid):
            raise plain_error(f"must be one of {', '.join(valid)} (got {v!r})")
        return v

    @field_validator("sparse_gradients")
    @classmethod
    def _no_sparse(cls, v):
        if v:
            raise plain_error("sparse gradients are not supported by dsfast yet; set it to false "
                              "(nn.Embedding(sparse=False))")
        return v

    @field_validator(*UNSUPPORTED_FEATURES)
    @classmethod
    def _unsupported(cls, v, info):
        check_unsupported_feature(info.field_name, v)
        return v

    @model_validator(mode="after")
    def _one_precision(self):
        if self.fp16.enabled and self.bf16.enabled:
            raise nested_error([(("bf16",), '"fp16" and "bf16" are both enabled; they are mutually exclusive, '
                                            "enable only one")])
        if self.fp16.enabled and self.torch_autocast.enabled:
            # fp16 brings an fp16 model and its own loss scaler; torch_autocast keeps the model's weights and (for
            # fp16) a torch GradScaler. DeepSpeed <= 0.17 refused the pair; 0.19 accepts it but at stage 0 stacks
            # the GradScaler on its fp16 optimizer's scaling. bf16 + torch_autocast stays allowed, as in 0.19.
            raise nested_error([(("torch_autocast", "enabled"),
                                 'true together with "fp16": {"enabled": true}; use one: torch_autocast keeps fp32 '
                                 "weights and computes eligible ops in its dtype, fp16 trains an fp16 model with "
                                 "fp32 master weights")])
        return self

    @model_validator(mode="after")
    def _master_precision(self):
        errors = master_precision_errors(self) + overlap_step_errors(self)
        if errors:
            raise nested_error(errors)
        return self

    @model_validator(mode="after")
    def _offload_needs_stage(self):
        errors = self.zero_optimization.offload_stage_errors()
        if errors:
            raise nested_error(errors)
        return self

    @model_validator(mode="after")
    def _unmanaged_accumulation(self):
        # DeepSpeed 0.19.8 refuses the pair: below stage 2 the reduction runs in step(), not during backward
        if not self.managed_gradient_accumulation and self.zero_stage < 2 and \
                self.zero_optimization.overlap_comm_resolved:
            raise nested_error([(("managed_gradient_accumulation",),
                                 f"false supports zero_optimization.overlap_comm only at ZeRO stage 2 or 3 (stage "
                                 f"is {self.zero_stage}); set overlap_comm to false or use stage 2")])
        return self

    @model_validator(mode="after")
    def _batch(self, info: ValidationInfo):
        world = int((info.context or {}).get("world_size", 1))
        try:
            t, m, g = resolve_batch_sizes(self.train_batch_size, self.train_micro_batch_size_per_gpu,
                                          self.gradient_accumulation_steps, world)
        except BatchSizeError as err:
            raise nested_error([(("train_batch_size",), str(err))]) from None
        self.train_batch_size, self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps = t, m, g
        self._world_size = world
        return self

    # ----------------------------------------------------------------------------------------------- helpers
    @property
    def precision(self) -> str:
        """"fp16", "bf16" or "fp32": the dtype the model computes in."""
        return "fp16" if self.fp16.enabled else "bf16" if self.bf16.enabled else "fp32"

    @property
    def zero_stage(self) -> int:
        return self.zero_optimization.stage

    @property
    def world_size(self) -> int:
        """The data-parallel world size the batch sizes were resolved against."""
        return self._world_size

    @property
    def source(self) -> Optional[str]:
        """The file the config was read from (None for a dict)."""
        return self._source

    @property
    def raw(self) -> dict:
        """A copy of the mapping the user gave (before defaults and batch resolution), e.g. for checkpoints."""
        return copy.deepcopy(self._raw) if self._raw is not None else self.model_dump(exclude_unset=True)

    # DeepSpeed's engine.config is the dict the program passed: programs read it as one
    # (`engine.config.get("zero_optimization", {}).get("stage")`, `engine.config["train_batch_size"]`).
    # These read (copies of) that mapping as given; the typed fields above are what dsfast acts on.
    def get(self, key, default=None):
        return self.raw.get(key, default)

    def __getitem__(self, key):
        raw = self.raw
        if key not in raw:
            raise KeyError(f"{key!r} is not in the config as given (set keys: {', '.join(sorted(raw)) or 'none'})")
        return raw[key]

    def __contains__(self, key):
        return key in (self._raw if self._raw is not None else self.raw)

    def keys(self):
        return self.raw.keys()

    def items(self):
        return self.raw.items()

    def values(self):
        return self.raw.values()

    @property
    def dynamic_loss_scale(self) -> bool:
        return self.fp16.enabled and self.fp16.dynamic

    def ignored_settings(self) -> List[str]:
        """Human-readable notes for settings that are valid DeepSpeed but have no effect in dsfast."""
        notes: List[str] = []
        for path, why in NOT_YET_HONOURED.items():
            section, _, key = path.rpartition(".")
            owner = getattr(self, section) if section else self
            default = type(owner).model_fields[key].default
            if getattr(owner, key) != default:
                notes.append(f"{path} is ignored: {why}")
        notes += self.bf16.ignored()
        notes += self.zero_optimization.ignored()
        for name in ("flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "compile",
                     "activation_checkpointing", "timers"):
            notes += getattr(self, name).ignored(name)
        if self.data_types.grad_accum_dtype is not None:
            notes.append("data_types.grad_accum_dtype is ignored; gradients accumulate in the parameters' dtype")
        if self.communication_data_type is not None and self.zero_stage == 0 and self.precision != "fp32" \
                and self.communication_data_type != "fp32":
            notes.append(f"communication_data_type={self.communication_data_type!r} is ignored at ZeRO stage 0: its "
                         "buckets reduce and accumulate 16-bit gradients in fp32")
        elif self.communication_data_type is not None and self.zero_stage == 0 and self.precision == "fp32" \
                and self.communication_data_type != "fp32":
            notes.append(f"communication_data_type={self.communication_data_type!r} is ignored for an fp32 model at "
                         "ZeRO stage 0: gradients are all-reduced in fp32")
        if self.seq_parallel_communication_data_type is not None:
            notes.append("seq_parallel_communication_data_type is ignored; dsfast has no sequence parallelism")
        for flag, why in (("dump_state", "no state dump"),
                          ("disable_allgather", "no ZeRO all-gather at stage 0"),
                          ("use_data_before_expert_parallelism", "dsfast has no expert parallelism"),
                          ("log_level", 'configure the "dsfast" logger with the logging module')):
            if getattr(self, flag):
                notes.append(f"{flag} is ignored ({why})")
        if self.optimizer is not None and self.optimizer.legacy_fusion:
            notes.append("optimizer.legacy_fusion is ignored (a DeepSpeed fp16 optimizer variant)")
        for key in UNSUPPORTED_FEATURES:
            if getattr(self, key) is not None:
                notes.append(f'"{key}" is present but disabled; ignored')
        for key, why in IGNORED_SECTIONS.items():
            if getattr(self, key) and key != "aio":
                notes.append(f'"{key}" is ignored: {why}')
        z = self.zero_optimization
        if not z.ignore_unused_parameters and not (z.stage in (1, 2) and z.offload_optimizer_device != "none"):
            notes.append("zero_optimization.ignore_unused_parameters=false is ignored here: as in DeepSpeed, unused "
                         "parameters are checked only at ZeRO stages 1-2 with offload_optimizer")
        if z.offload_param is not None and z.offload_param.device != "none" and z.stage != 3:
            notes.append(f"zero_optimization.offload_param is ignored at ZeRO stage {z.stage}: parameters are "
                         "offloaded only at stage 3, as in DeepSpeed")
        notes += aio_notes(self.aio, "nvme" in (z.offload_optimizer_device, z.offload_param_device))
        return notes
