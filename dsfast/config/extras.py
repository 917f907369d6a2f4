"""The other top-level sections users carry over from DeepSpeed configs.

Each is decided explicitly: validated and used, validated and reported as ignored (a warning through
DsConfig.ignored_settings), or rejected. Nothing passes silently.
"""
from __future__ import annotations

from typing import Any, List, Optional

from pydantic import Field, field_validator

from .base import StrictModel, plain_error

_DTYPES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "half": "fp16",
           "bf16": "bf16", "bfp16": "bf16", "bfloat16": "bf16"}


def normalize_dtype(v: Optional[str]) -> Optional[str]:
    if v is None:
        return None
    if not isinstance(v, str) or v.lower() not in _DTYPES:
        raise plain_error(f'must be one of "fp32", "fp16", "bf16" (got {v!r})')
    return _DTYPES[v.lower()]


class ParallelWriteConfig(StrictModel):
    pipeline_stage: bool = False


class CheckpointConfig(StrictModel):
    tag_validation: str = "Warn"           # Ignore | Warn | Fail (any case)
    load_universal: bool = False
    use_node_local_storage: bool = False
    checkpoint_serialization: bool = True  # torch.save's zipfile format, for TorchCheckpointEngine (DeepSpeed's key)
    parallel_write: ParallelWriteConfig = Field(default_factory=ParallelWriteConfig)
    # dsfast's own: write from host copies in a background thread; bound on every wait for the other ranks
    async_save: bool = False
    timeout_s: float = Field(300.0, gt=0)

    @field_validator("tag_validation", mode="before")
    @classmethod
    def _tag(cls, v):
        valid = {"ignore": "Ignore", "warn": "Warn", "fail": "Fail"}
        if not isinstance(v, str) or v.lower() not in valid:
            raise plain_error(f'must be "Ignore", "Warn" or "Fail" (got {v!r})')
        return valid[v.lower()]


class HangWatchConfig(StrictModel):
    """dsfast's own: when a rank has waited `after_s` in one collective, compare every rank's position over the
    store and stop the job with a message saying which rank is where (dsfast/comm/hang_watch.py)."""
    enabled: bool = True
    after_s: float = Field(30.0, gt=0)


class DataTypesConfig(StrictModel):
    grad_accum_dtype: Optional[str] = None
    # buffers kept in fp32 under fp16/bf16 (dsfast/precision/keep_fp32.py): "auto" (the model's own lists) or
    # name patterns ([] keeps nothing), as DeepSpeed 0.19.8
    keep_in_fp32_modules: Any = "auto"

    @field_validator("keep_in_fp32_modules", mode="before")
    @classmethod
    def _patterns(cls, v):
        if v == "auto" or (isinstance(v, list) and all(isinstance(n, str) for n in v)):
            return v
        raise plain_error(f'must be "auto" (the model\'s _keep_in_fp32_modules lists) or a list of buffer name '
                          f'patterns such as ["*e_score_correction_bias"] ([] keeps nothing); got {v!r}')

    @field_validator("grad_accum_dtype", mode="before")
    @classmethod
    def _norm(cls, v):
        return normalize_dtype(v)


class _Enabled(StrictModel):
    enabled: bool = False

    def ignored(self, name: str) -> List[str]:
        return [f"{name} is enabled but dsfast does not implement it yet; it is ignored"] if self.enabled else []


class _Monitored(_Enabled):
    def ignored(self, name: str) -> List[str]:
        return []     # acted on: dsfast.engine.monitor


class TensorboardConfig(_Monitored):
    output_path: str = ""
    job_name: str = "DeepSpeedJobName"


class CsvMonitorConfig(TensorboardConfig):
    pass


class WandbConfig(_Monitored):
    group: Optional[str] = None
    team: Optional[str] = None
    project: str = "deepspeed"


class CometConfig(_Enabled):
    samples_log_interval: int = Field(100, ge=1)
    project: Optional[str] = None
    workspace: Optional[str] = None
    api_key: Optional[str] = None
    experiment_name: Optional[str] = None
    experiment_key: Optional[str] = None
    online: Optional[bool] = None
    mode: Optional[str] = None


class CommsLoggerConfig(_Enabled):
    verbose: bool = False
    prof_all: bool = True
    debug: bool = False
    prof_ops: List[str] = Field(default_factory=list)


class FlopsProfilerConfig(_Enabled):
    recompute_fwd_factor: float = Field(0.0, ge=0)
    profile_step: int = Field(1, ge=1)
    module_depth: int = -1
    top_modules: int = Field(1, ge=1)
    detailed: bool = True
    output_file: Optional[str] = None

    def ignored(self, name: str) -> List[str]:
        return []     # acted on: dsfast.profiling.flops_profiler.EngineProfile


# The compile section of DeepSpeed 0.19.8 configures DeepCompile (its compiler passes for ZeRO); engine.compile()
# itself is torch.compile of the module (engine/compile.py). DeepCompile's switches are refused by name, its tuning
# knobs have no effect without it (in DeepSpeed too: noted). enabled/backend/kwargs are DeepSpeed <= 0.14.3's keys
# (0.19.8 refuses them): honoured, initialize() compiles the module with them.
DEEPCOMPILE_SWITCHES = {
    "deepcompile": "DeepCompile (DeepSpeed's compiler passes for ZeRO) is not supported by dsfast; remove it or set "
                   "false: engine.compile() still compiles the module with torch.compile",
    "autoep_non_moe": "compiling around AutoEP layers needs AutoEP (expert parallelism), which dsfast lacks; remove "
                      "it or set false",
    "passes": "DeepCompile passes are not supported by dsfast; remove the key (engine.compile() compiles the module "
              "with torch.compile)",
}


class CompileConfig(_Enabled):
    enabled: bool = False
    backend: str = "inductor"
    kwargs: dict = Field(default_factory=dict)
    deepcompile: bool = False
    autoep_non_moe: bool = False
    passes: Optional[List[str]] = None
    free_activation: bool = False
    free_activation_threshold: int = 10 * 1024 * 1024
    offload_activation: bool = False
    offload_activation_pin_memory: bool = True
    offload_opt_states: bool = False
    double_buffer: bool = True
    symmetric_memory: bool = False
    debug_log: bool = False
    offload_parameters: bool = False
    sync_before_reduce: bool = False
    sync_after_reduce: bool = False
    sync_before_allgather: bool = False
    sync_after_allgather: bool = False
    keep_int_input_tensors: bool = True
    keep_all_input_tensors: bool = False

    @field_validator("deepcompile", "autoep_non_moe", "passes")
    @classmethod
    def _no_deepcompile(cls, v, info):
        if v:
            raise plain_error(DEEPCOMPILE_SWITCHES[info.field_name] + f" (got {v!r})")
        return v

    def ignored(self, name: str) -> List[str]:
        tuning = [k for k in sorted(self.model_fields_set)
                  if k not in ("enabled", "backend", "kwargs", *DEEPCOMPILE_SWITCHES)
                  and getattr(self, k) != type(self).model_fields[k].default]
        return [f"{name}.{k} tunes DeepCompile, which is off: it has no effect (in DeepSpeed 0.19.8 neither)"
                for k in tuning]


class ActivationCheckpointingConfig(StrictModel):
    partition_activations: bool = False
    contiguous_memory_optimization: bool = False
    cpu_checkpointing: bool = False
    number_checkpoints: Optional[int] = Field(None, ge=1)
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False

    def ignored(self, name: str) -> List[str]:
        if self.model_fields_set:
            return [f"{name} configures DeepSpeed's own checkpointing API, which dsfast does not have; "
                    "it is ignored (use torch.utils.checkpoint in the model)"]
        return []


class ThroughputTimerConfig(StrictModel):
    enabled: bool = True
    synchronized: bool = True


class TimersConfig(StrictModel):
    """`timers.throughput` drives engine.tput_timer (dsfast.utils.timer), as in DeepSpeed."""
    throughput: ThroughputTimerConfig = Field(default_factory=ThroughputTimerConfig)

    def ignored(self, name: str) -> List[str]:
        return []


# DeepSpeed features dsfast does not have. Enabled (or, for sections without "enabled", present): an error.
UNSUPPORTED_FEATURES = {
    "pipeline": "pipeline parallelism",
    "sparse_attention": "sparse attention kernels",
    "compression_training": "compression training",
    "curriculum_learning": "curriculum learning",
    "data_efficiency": "data efficiency (curriculum / random-LTD)",
    "elasticity": "elastic training",
    "autotuning": "the autotuner",
    "quantize_training": "quantization-aware training",
    "eigenvalue": "eigenvalue computation",
    "progressive_layer_drop": "progressive layer drop",
    "hybrid_engine": "the RLHF hybrid engine",
    "weight_quantization": "weight quantization",
    "tensor_parallel": "tensor parallelism",
    "expert_parallel": "expert parallelism (MoE)",
    "graph_harvesting": "graph harvesting (removed in DeepSpeed 0.19 too)",
}


# Tuning blocks of I/O paths dsfast does not have; honouring them could not change training results.
# ("aio" is acted on where NVMe offload runs: aio_notes below.)
IGNORED_SECTIONS = {
    "aio": "it tunes NVMe offload I/O, and no offload here goes to NVMe",
    "nebula": "it selects DeepSpeed's Nebula checkpoint engine; dsfast writes its own checkpoints",
}


def check_unsupported_feature(key: str, value: Any) -> None:
    """Raise for a DeepSpeed feature section that would change training if honoured."""
    if value is None or value is False or value == {}:
        return
    if isinstance(value, dict) and "enabled" in value and not value["enabled"]:
        return
    raise plain_error(f"{UNSUPPORTED_FEATURES[key]} is not supported by dsfast; remove \"{key}\""
                      + (' or set "enabled": false' if isinstance(value, dict) and "enabled" in value else ""))


# aio keys: the NVMe swap's I/O pool acts on these (placement.aio_pool) ...
AIO_ACTED = ("block_size", "intra_op_parallelism", "thread_count")
# ... and has no use for these: it issues blocking preadv / pwritev calls from its threads
AIO_NOT_ACTED = {
    "queue_depth": "each swap thread has one read or write in flight (the thread count is the queue depth)",
    "single_submit": "there is no submission queue (blocking preadv / pwritev per thread)",
    "overlap_events": "reads and writes always overlap the step (the swap's thread pool)",
    "use_gds": "GPUDirect Storage is not used (the swap reads into host buffers)",
}


def check_aio(aio: Any) -> Any:
    """The aio section's numbers are positive integers (an error names the key)."""
    if aio is None:
        return aio
    if not isinstance(aio, dict):
        raise plain_error(f"must be an object of aio settings (got {type(aio).__name__})")
    for key in AIO_ACTED + ("queue_depth",):
        v = aio.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise plain_error(f"aio.{key} must be a positive integer (got {v!r})")
    return aio


def aio_notes(aio: Any, nvme: bool) -> List[str]:
    """Notes for the aio keys that have no effect (all of them when nothing is offloaded to NVMe)."""
    if not aio:
        return []
    if not nvme:
        return [f'"aio" is ignored: {IGNORED_SECTIONS["aio"]}']
    notes = []
    for key in aio:
        if key in AIO_NOT_ACTED:
            notes.append(f"aio.{key} is ignored: {AIO_NOT_ACTED[key]}")
        elif key not in AIO_ACTED:
            notes.append(f"aio.{key} is ignored: not an aio setting dsfast knows (acted on: "
                         f"{', '.join(AIO_ACTED)})")
    if "intra_op_parallelism" in aio and "thread_count" in aio:
        notes.append("aio.thread_count is ignored: aio.intra_op_parallelism sets the swap's threads")
    threads = aio.get("intra_op_parallelism", aio.get("thread_count"))
    if threads == 1:   # placement.aio_pool
        notes.append("the NVMe swap uses 2 threads, not 1: a read and a write must be able to run together")
    return notes
