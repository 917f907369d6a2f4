"""The engine's secondary DeepSpeed API: small queries and old names that programs call around the training loop
(logging, saving, generation, their own data loaders). Mixed into dsfast.engine.Engine."""
import torch
import torch.distributed as dist

from .data import build_dataloader


class DeepSpeedQueries:
    def steps_per_print(self):
        return self.config.steps_per_print

    def wall_clock_breakdown(self):
        return bool(self.config.wall_clock_breakdown)

    def zero_optimization(self):
        return self.config.zero_stage > 0

    def zero_offload_optimizer(self):
        return self.config.zero_optimization.offload_optimizer_device == "cpu"

    def zero_offload_param(self):
        return self.config.zero_optimization.offload_param_device == "cpu"

    def dynamic_loss_scale(self):
        return self.fp16_enabled() and self.config.dynamic_loss_scale

    def get_batch_info(self):
        """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)."""
        return self.train_batch_size(), self.train_micro_batch_size_per_gpu(), self.gradient_accumulation_steps()

    def get_mom(self):
        """Per param group: Adam's betas, or SGD's momentum (DeepSpeed's get_mom)."""
        if self.optimizer is None:
            return []
        return [g["betas"] if "betas" in g else g.get("momentum", 0.0) for g in self.optimizer.param_groups]

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
        store = getattr(self._owner, "store", None)
        for r in getattr(store, "all_records", ()):
            r.release()

    def deepspeed_io(self, dataset, batch_size=None, route=None, pin_memory=True, data_sampler=None,
                     collate_fn=None, num_local_io_workers=None):
        """A DataLoader over `dataset` sharded across the data-parallel ranks (DistributedSampler), with the
        micro batch size unless batch_size is given, as initialize(training_data=...) builds it."""
        if data_sampler is not None:
            raise ValueError("deepspeed_io(data_sampler=...) is not supported; build the DataLoader in the script")
        return build_dataloader(dataset, batch_size or self.train_micro_batch_size_per_gpu(), self.dp_world_size,
                                self.global_rank, collate_fn=collate_fn, num_workers=num_local_io_workers or 0,
                                pin_memory=bool(pin_memory) and torch.cuda.is_available())
