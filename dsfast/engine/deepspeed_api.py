"""The engine's secondary DeepSpeed API: small queries and old names that programs call around the training loop
(logging, saving, generation, their own data loaders). Mixed into dsfast.engine.Engine."""
import operator

import torch
import torch.distributed as dist

from .data import build_dataloader

# DeepSpeed's one-line getters of config values: engine method -> path in dsfast's DsConfig
_CONFIG_GETTERS = {
    "zero_reduce_bucket_size": "zero_optimization.reduce_bucket_size",
    "zero_allgather_bucket_size": "zero_optimization.allgather_bucket_size",
    "zero_allgather_partitions": "zero_optimization.allgather_partitions",
    "zero_contiguous_gradients": "zero_optimization.contiguous_gradients",
    "zero_reduce_scatter": "zero_optimization.reduce_scatter",
    "zero_overlap_comm": "zero_optimization.overlap_comm_resolved",
    "zero_sub_group_size": "zero_optimization.sub_group_size",
    "zero_round_robin_gradients": "zero_optimization.round_robin_gradients",
    "zero_elastic_checkpoint": "zero_optimization.elastic_checkpoint",
    "zero_load_from_fp32_weights": "zero_optimization.load_from_fp32_weights",
    "zero_ignore_unused_parameters": "zero_optimization.ignore_unused_parameters",
    "zero_compute_grad_norm": "zero_optimization.compute_grad_norm",
    "zero_param_persistence_threshold": "zero_optimization.param_persistence_threshold",
    "zero_model_persistence_threshold": "zero_optimization.model_persistence_threshold",
    "zero_max_live_parameters": "zero_optimization.max_live_parameters",
    "zero_max_reuse_distance": "zero_optimization.max_reuse_distance",
    "zero_prefetch_bucket_size": "zero_optimization.prefetch_bucket_size",
    "zero_module_granularity_threshold": "zero_optimization.module_granularity_threshold",
    "zero_allgather_sequential": "zero_optimization.allgather_sequential",
    "zero_hpz_partition_size": "zero_optimization.zero_hpz_partition_size",
    "zero_quantized_weights": "zero_optimization.zero_quantized_weights",
    "zero_quantized_nontrainable_weights": "zero_optimization.zero_quantized_nontrainable_weights",
    "zero_quantized_gradients": "zero_optimization.zero_quantized_gradients",
    "zero_gather_16bit_weights_on_model_save": "zero_optimization.gather_16bit_weights_on_model_save",
    "zero_allow_untested_optimizer": "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer": "zero_force_ds_cpu_optimizer",
    "gradient_predivide_factor": "gradient_predivide_factor",
    "dataloader_drop_last": "dataloader_drop_last",
    "managed_gradient_accumulation": "managed_gradient_accumulation",
    "dump_state": "dump_state",
    "fp16_auto_cast": "fp16.auto_cast",
    "zero_multi_rank_bucket_allreduce": "zero_optimization.use_multi_rank_bucket_allreduce",
    "zero_legacy_stage1": "zero_optimization.legacy_stage1",
    "zero_parameter_alignment": "zero_optimization.parameter_alignment",
    "zero_log_trace_cache_warnings": "zero_optimization.log_trace_cache_warnings",
    "zero_save_muon_momentum_buffer_in_memory": "zero_optimization.save_muon_momentum_buffer_in_memory",
    "is_sanity_checks_enabled": "zero_optimization.enable_sanity_checks",
    "zenflow_config": "zero_optimization.zenflow",
    "fp16_master_weights_and_gradients": "fp16.fp16_master_weights_and_grads",
    "bf16_master_weights_and_gradients": "bf16.bf16_master_weights_and_grads",
    "bf16_optimizer_states": "bf16.bf16_optimizer_states",
    "torch_autocast_enabled": "torch_autocast.enabled",
    "use_node_local_storage": "checkpoint.use_node_local_storage",
    "load_universal_checkpoint": "checkpoint.load_universal",
    "checkpoint_serialization_enabled": "checkpoint.checkpoint_serialization",
    "log_level": "log_level",
    "flops_profiler_enabled": "flops_profiler.enabled",
    "flops_profiler_recompute_fwd_factor": "flops_profiler.recompute_fwd_factor",
    "flops_profiler_profile_step": "flops_profiler.profile_step",
    "flops_profiler_module_depth": "flops_profiler.module_depth",
    "flops_profiler_top_modules": "flops_profiler.top_modules",
    "flops_profiler_detailed": "flops_profiler.detailed",
    "flops_profiler_output_file": "flops_profiler.output_file",
}

# DeepSpeed's getters of features dsfast refuses in the config (so always off here): engine method -> value
_OFF_GETTERS = {
    "autotuning_enabled": False, "autotuning_profile_model_info": False, "data_efficiency_enabled": False,
    "data_sampling_enabled": False, "curriculum_learning_enabled": False, "random_ltd_enabled": False,
    "checkpoint_writer_enabled": False, "is_deepcompile_enabled": False, "is_deepcompile_active": False,
    "compile_zero_optimization_stage": False, "compile_autosp": False, "compile_autotp": False,
    "uses_parallelization_pass_only": False, "autotp_size": 0,
}

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class DeepSpeedQueries:
    def steps_per_print(self):
        return self.config.steps_per_print

    def wall_clock_breakdown(self):
        return bool(self.config.wall_clock_breakdown)

    def zero_optimization(self):
        return self.config.zero_stage > 0

    def zero_offload_optimizer(self):
        """The offload_optimizer section (device, nvme_path, pin_memory, buffer_count, ...; DeepSpeed's defaults
        for keys not given, pin_memory true), or None without one, as DeepSpeed's."""
        return self.config.zero_optimization.offload_optimizer

    def zero_offload_param(self):
        """The offload_param section (device, pin_memory, buffer_count, buffer_size, max_in_cpu, ...) or None."""
        return self.config.zero_optimization.offload_param

    def dynamic_loss_scale(self):
        """DeepSpeed's answer: fp16.loss_scale is 0 (the default), whether or not fp16 is enabled."""
        return self.config.fp16.loss_scale == 0

    @property
    def communication_data_type(self):
        """The dtype gradients are reduced in: the config's communication_data_type, else the model's (fp16,
        bf16) or fp32."""
        given = self.config.communication_data_type
        if given is not None:
            return _DTYPES[given]
        return torch.float16 if self.fp16_enabled() else torch.bfloat16 if self.bfloat16_enabled() else \
            torch.float32

    def torch_autocast_dtype(self):
        given = self.config.torch_autocast.dtype
        return None if given is None else _DTYPES[given]

    def torch_autocast_lower_precision_safe_modules(self):
        """The configured class names, else DeepSpeed's defaults spelt as DeepSpeed spells them (module.Class)."""
        given = self.config.torch_autocast.lower_precision_safe_modules
        if given is not None:
            return list(given)
        from .autocast import DEFAULT_LOWER_PRECISION_SAFE_MODULES, resolve_module_classes
        return [f"{c.__module__}.{c.__name__}" for c in resolve_module_classes(DEFAULT_LOWER_PRECISION_SAFE_MODULES)]

    def optimizer_legacy_fusion(self):
        return bool(self.config.optimizer is not None and self.config.optimizer.legacy_fusion)

    def checkpoint_tag_validation_enabled(self):
        return self.config.checkpoint.tag_validation != "Ignore"

    def checkpoint_tag_validation_fail(self):
        return self.config.checkpoint.tag_validation == "Fail"

    def zero_partial_offload(self):
        return getattr(self.config.zero_optimization.offload_optimizer, "ratio", 1.0)

    def super_offload(self):
        return getattr(self.config.zero_optimization.offload_optimizer, "super_offload", False)

    def cpuadam_cores_perc(self):
        return getattr(self.config.zero_optimization.offload_optimizer, "cpuadam_cores_perc", 0.9)

    def zero_nvme_offload_optimizer(self):
        return self.config.zero_optimization.offload_optimizer_device == "nvme"

    def is_first_weights_partition_group(self):
        return self.zero_optimization_partition_weights()

    def get_type(self):
        return self._optimizer_param("type")

    @staticmethod
    def is_map_style_dataset(obj):
        return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")

    @staticmethod
    def is_iterable_style_dataset(obj):
        return isinstance(obj, torch.utils.data.IterableDataset)

    def _optimizer_param(self, key):
        """[group[key] per param group] (0.0 where a group lacks it); [] without an optimizer (DeepSpeed's)."""
        if self.optimizer is None:
            return []
        return [g.get(key, 0.0) for g in self.optimizer.param_groups]

    def get_batch_info(self):
        """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)."""
        return self.train_batch_size(), self.train_micro_batch_size_per_gpu(), self.gradient_accumulation_steps()

    def get_mom(self):
        """Per param group, as DeepSpeed's: the momentum when optimizer_name() is "SGD" or "RMSprop" (a client
        torch optimizer of those classes), else the betas (0.0 for a group without them)."""
        return self._optimizer_param("momentum" if self.optimizer_name() in ("SGD", "RMSprop") else "betas")

    @property
    def mp_world_size(self):
        return 1          # dsfast has no model parallelism

    @property
    def data_parallel_group(self):
        return dist.group.WORLD if dist.is_available() and dist.is_initialized() else None

    def save_fp16_model(self, save_dir, save_filename="pytorch_model.bin", exclude_frozen_parameters=False):
        """DeepSpeed's older name of save_16bit_model."""
        return self.save_16bit_model(save_dir, save_filename, exclude_frozen_parameters)

    def empty_partition_cache(self):
        """Stage 3: give back every parameter still gathered whole outside a forward (after generate(), or a
        GatheredParameters block that has ended), except the persistent ones. A no-op at other stages."""
        self.state_owner.empty_partition_cache()

    def deepspeed_io(self, dataset, batch_size=None, route=None, pin_memory=True, data_sampler=None,
                     collate_fn=None, num_local_io_workers=None):
        """A DataLoader over `dataset` sharded across the data-parallel ranks (DistributedSampler), with the
        micro batch size unless batch_size is given, as initialize(training_data=...) builds it."""
        if data_sampler is not None:
            raise ValueError("deepspeed_io(data_sampler=...) is not supported; build the DataLoader in the script")
        return build_dataloader(dataset, batch_size or self.train_micro_batch_size_per_gpu(), self.dp_world_size,
                                self.global_rank, collate_fn=collate_fn, num_workers=num_local_io_workers or 0,
                                pin_memory=bool(pin_memory) and torch.cuda.is_available())

    # ---- what the config says, under DeepSpeed's method names (plus _CONFIG_GETTERS below) ---------------------
    def zero_cpu_offload(self):
        return self.config.zero_optimization.offload_optimizer_device == "cpu"

    def zero_use_cpu_optimizer(self):
        """The optimizer steps on the CPU: its states are offloaded to the CPU or to NVMe."""
        return self.config.zero_optimization.offload_optimizer_device in ("cpu", "nvme")

    def zero_optimization_partition_gradients(self):
        return self.config.zero_stage >= 2

    def zero_optimization_partition_weights(self):
        return self.config.zero_stage == 3

    def postscale_gradients(self):
        return not self.config.prescale_gradients

    def optimizer_name(self):
        """A client optimizer's class name, else the config's optimizer type (lower case), as DeepSpeed's."""
        client = getattr(self, "client_optimizer", None)
        if client is not None:
            return type(client).__name__
        return self.config.optimizer.type if self.config.optimizer is not None else None

    def optimizer_params(self):
        """The "params" of the config's "optimizer" section as written (None without one)."""
        return (self.config.get("optimizer") or {}).get("params")

    def scheduler_name(self):
        return self.config.scheduler.type if self.config.scheduler is not None else None

    def scheduler_params(self):
        return (self.config.get("scheduler") or {}).get("params")

    def initial_dynamic_scale(self):
        return 2 ** self.config.fp16.initial_scale_power

    def dynamic_loss_scale_args(self):
        """DeepSpeed's dict of the dynamic loss scaler's settings (from the fp16 section, enabled or not)."""
        f = self.config.fp16
        return {"init_scale": 2 ** f.initial_scale_power, "scale_window": f.loss_scale_window,
                "delayed_shift": f.hysteresis, "consecutive_hysteresis": f.consecutive_hysteresis,
                "min_scale": f.min_loss_scale}

    def get_data_parallel_rank(self):
        return self.global_rank

    def get_model_parallel_rank(self):
        return 0          # dsfast has no model parallelism

    def get_tensor_parallel_rank(self):
        return 0

    def get_sequence_parallel_group(self):
        return None       # nor sequence parallelism

    # ---- the module's weights alone ------------------------------------------------------------------------
    def module_state_dict(self, destination=None, prefix="", keep_vars=False, exclude_frozen_parameters=False):
        self.state_owner.settle()   # overlap_step: the updated values
        sd = self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)
        if exclude_frozen_parameters:
            frozen = {prefix + n for n, p in self.module.named_parameters() if not p.requires_grad}
            sd = type(sd)((k, v) for k, v in sd.items() if k not in frozen)
        return sd

    def load_module_state_dict(self, checkpoint, strict=True, custom_load_fn=None, fetch_z3_params=False):
        """Load model weights (`checkpoint["module"]`, or a plain state dict) into the module and the optimizer's
        fp32 masters, at any ZeRO stage (stage 3: each rank keeps its slice); custom_load_fn(src=, dst=) loads
        instead of load_state_dict."""
        from ..checkpoint.layout import checkpoint_layout, engine_after_load, masters_from_module
        from ..checkpoint.load import load_module_state
        sd = checkpoint["module"] if isinstance(checkpoint, dict) and "module" in checkpoint else checkpoint
        stage3 = self.config.zero_stage == 3
        with torch.no_grad():
            if custom_load_fn is not None:
                if stage3:
                    raise NotImplementedError("load_module_state_dict(custom_load_fn=...) at ZeRO stage 3: load the "
                                              "whole weights with the default loader, or inside GatheredParameters"
                                              "(..., modifier_rank=0)")
                custom_load_fn(src=sd, dst=self.module)
            else:
                load_module_state(self.module, sd, strict, "load_module_state_dict", stage3)
            if not stage3:
                masters_from_module(self, checkpoint_layout(self))
            engine_after_load(self)

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters=False):
        """The whole weights in the model dtype on rank 0 (None on the others): what Hugging Face's accelerate
        saves at stage 3. A collective."""
        from ..zero.params.save16 import gathered_state_dict
        sd = gathered_state_dict(self.module, exclude_frozen=exclude_frozen_parameters)
        return sd if self.global_rank == 0 else None

    # ---- batch size during training ------------------------------------------------------------------------
    def set_train_batch_size(self, train_batch_size):
        """A new global batch size made of more or fewer micro-batches (gradient_accumulation_steps); the micro
        batch size stays. Only at a gradient accumulation boundary."""
        micro = self.train_micro_batch_size_per_gpu()
        per_step = micro * self.dp_world_size
        if not isinstance(train_batch_size, int) or train_batch_size < 1 or train_batch_size % per_step:
            raise ValueError(f"set_train_batch_size({train_batch_size!r}): must be a positive multiple of "
                             f"train_micro_batch_size_per_gpu * data-parallel world size = {micro} * "
                             f"{self.dp_world_size} = {per_step}")
        self._check_boundary("set_train_batch_size")
        self.config.train_batch_size = train_batch_size
        self.config.gradient_accumulation_steps = train_batch_size // per_step
        self._cycle_origin = self.micro_steps     # the next cycle has the new length from its first micro-batch

    def set_train_micro_batch_size(self, micro_batch_size):
        """A new micro batch size with the same gradient_accumulation_steps (the global batch size follows).
        A DataLoader initialize() built keeps its batch size: build a new one (deepspeed_io)."""
        if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
            raise ValueError(f"set_train_micro_batch_size({micro_batch_size!r}): must be a positive int")
        self._check_boundary("set_train_micro_batch_size")
        self.config.train_micro_batch_size_per_gpu = micro_batch_size
        self.config.train_batch_size = micro_batch_size * self.gradient_accumulation_steps() * self.dp_world_size

    def _check_boundary(self, what):
        gas = self.gradient_accumulation_steps()
        done = (self.micro_steps - self._cycle_origin) % gas
        if done:
            raise RuntimeError(f"{what}: called after {done} of {gas} micro-batches of a "
                               f"gradient accumulation cycle; call it right after engine.step() ends a cycle")


def _config_getter(name, path):
    read = operator.attrgetter(path)

    def getter(self):
        return read(self.config)
    getter.__name__, getter.__qualname__ = name, f"DeepSpeedQueries.{name}"
    getter.__doc__ = f"The config's {path}."
    return getter


def _constant_getter(name, value):
    def getter(self):
        return value
    getter.__name__, getter.__qualname__ = name, f"DeepSpeedQueries.{name}"
    getter.__doc__ = f"Always {value!r}: dsfast refuses this DeepSpeed feature in the config."
    return getter


for _name, _path in _CONFIG_GETTERS.items():
    if not hasattr(DeepSpeedQueries, _name):
        setattr(DeepSpeedQueries, _name, _config_getter(_name, _path))
for _name, _value in _OFF_GETTERS.items():
    if not hasattr(DeepSpeedQueries, _name):
        setattr(DeepSpeedQueries, _name, _constant_getter(_name, _value))
