"""The training engine: forward / backward / step orchestration over one state owner.

The owner (built once by dsfast.zero.build.build_owner; dsfast.zero.owner.StateOwner lists what it
provides) holds the buffers, masters, reduction, step decision, update and write-back of its stage:
  stage 0  zero.replicated.Replicated        stage 1  zero.sharded.ShardedOptimizerState
  stage 2  zero.sharded.ShardedGradients     stage 3  zero.stage3.Stage3
The engine only sequences it: scale the loss, run backward, tell the owner where accumulation boundaries are,
ask it to step, drive the loss scaler and the LR scheduler, count steps, log.
"""
import contextlib
import os

import torch

from .autocast import autocast_plan
from .compile import Compiling
from .deepspeed_api import DeepSpeedQueries
from .monitor import Monitor
from .plain_backward import PlainBackward, engine_backward_running
from .progress import Progress
from .state_offload import StateOffload
from .unused_params import unused_parameter_check
from ..comm import where
from ..utils.timer import ThroughputTimer
from ..zero.owner import memory_breakdown


class NoSyncError(RuntimeError, AssertionError):
    """engine.no_sync() misused (an AssertionError too, as DeepSpeed asserts)."""


class NoOptimizerError(RuntimeError):
    """backward()/step() on an engine built without anything to optimize."""


class Engine(DeepSpeedQueries, StateOffload, Compiling, torch.nn.Module):
    """What `dsfast.initialize` returns. DeepSpeed's names: engine(batch), backward, step, ..."""

    def __init__(self, module, config, device, owner, optimizer, lr_scheduler, loss_scaler,
                 rank=0, world_size=1, training_dataloader=None):
        super().__init__()
        self.module = module
        self.config = config
        self._device = torch.device(device)
        self._owner = owner
        self._precision = owner.precision
        owner.bind_optimizer(optimizer)
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.loss_scaler = loss_scaler
        self.global_rank = rank
        self.world_size = self.dp_world_size = world_size
        self.training_dataloader = training_dataloader
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self._cycle_origin = 0      # micro_steps when gradient_accumulation_steps last changed (set_train_batch_size)
        self.skipped_steps = 0
        self._step_applied = False
        self._global_grad_norm = None
        self._boundary_override = None
        self._no_sync = False
        # managed_gradient_accumulation false (DeepSpeed 0.19.8): every step() is the boundary, the caller owns
        # accumulation; stages 0-1 reduce in step(), stages 2-3 in every backward (as DeepSpeed's)
        self._unmanaged = not config.managed_gradient_accumulation
        self._in_step = False
        self._backwards_since_step = 0
        self._clip = float(config.gradient_clipping or 0.0)
        self._unused_check = unused_parameter_check(config, module)   # ignore_unused_parameters: false
        precision = self._precision
        # torch_autocast: forward under torch.autocast, fp32 weights and gradients; float16 scales the loss
        self._autocast = autocast_plan(config, self._device)
        self._autocast.mark_lower_precision_params(module)
        self._scales_loss = precision.name == "fp16" or self._autocast.needs_grad_scaler
        self._check_overflow = self._scales_loss or (
            precision.name == "bf16" and bool(getattr(config.bf16, "check_grad_overflow", False)))
        self._param_names = {id(p): n for n, p in module.named_parameters()}
        self._progress = Progress(config.steps_per_print, rank, bool(config.wall_clock_breakdown), self._device)
        self.monitor = Monitor(config, rank)
        self._swap_mark = self.swap_bytes()   # NVMe offload: the swap's counters at the last step (init's writes)
        self._plain_backward = PlainBackward(self)
        # DeepSpeed's engine.tput_timer (programs call update_epoch_count()); silent: Progress prints samples/s
        self.tput_timer = ThroughputTimer(config.timers.throughput, batch_size=config.train_batch_size,
                                          steps_per_output=config.steps_per_print)
        self._flops_profile = None
        if config.flops_profiler.enabled:
            from ..profiling.flops_profiler.profiler import EngineProfile
            self._flops_profile = EngineProfile(self, config.flops_profiler)

    # ---- DeepSpeed-named properties -------------------------------------------------------------------
    @property
    def state_owner(self):
        """The ZeRO stage's state owner (dsfast.zero.owner.StateOwner): what checkpoints and dsfast.utils
        read the partitioned states through."""
        return self._owner

    @property
    def device(self):
        return self._device

    @property
    def local_rank(self):
        """This process's rank on its node (LOCAL_RANK, as every launcher sets it), on every device type."""
        if "LOCAL_RANK" in os.environ:
            return int(os.environ["LOCAL_RANK"])
        return self._device.index if self._device.type == "cuda" and self._device.index is not None else 0

    @property
    def loss_scale(self):
        """The current loss scale (1.0 unless fp16)."""
        return float(self.loss_scaler.loss_scale) if self.loss_scaler is not None else 1.0

    def train_batch_size(self):
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self):
        return self.config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self):
        return self.config.gradient_accumulation_steps

    def zero_optimization_stage(self):
        return self.config.zero_stage

    def fp16_enabled(self):
        return self._precision.name == "fp16"

    def bfloat16_enabled(self):
        return self._precision.name == "bf16"

    def gradient_clipping(self):
        return self._clip

    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups] if self.optimizer is not None else []

    def get_global_grad_norm(self):
        """Norm of the last applied step's gradients (only computed when clipping or overflow checks need it).
        The device-step path keeps it as a device tensor; it is read back here, when asked, not in the step."""
        if torch.is_tensor(self._global_grad_norm):
            self._global_grad_norm = float(self._global_grad_norm)
        return self._global_grad_norm

    def was_step_applied(self):
        return self._step_applied

    def is_gradient_accumulation_boundary(self):
        if self._unmanaged:      # the caller's step() is the boundary: True only while it runs
            return self._in_step
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps - self._cycle_origin + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary):
        """Force (True/False) or restore (None) the boundary decision, as DeepSpeed's method of the same name."""
        if self._unmanaged:
            raise RuntimeError("set_gradient_accumulation_boundary() does not apply with managed_gradient_accumulation"
                               "=false: each engine.step() is the boundary (the caller owns accumulation)")
        self._boundary_override = is_boundary

    def __getattr__(self, name):
        # DeepSpeed forwards unknown attributes to the wrapped module (engine.config_class, engine.generate, ...)
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules", {})
            if "module" in modules:
                return getattr(modules["module"], name)
            raise

    # ---- training ----------------------------------------------------------------------------------------
    def forward(self, *inputs, **kwargs):
        """module(*inputs, **kwargs). Under fp16/bf16, fp32 tensors in the inputs are cast to the model's dtype
        (whatever fp16.auto_cast says: DeepSpeed would fail with a dtype mismatch; integer inputs are untouched)."""
        self.require_states("forward")
        if not (self.module.training and torch.is_grad_enabled()):
            self._owner.settle()   # overlap_step: an evaluation reads every parameter (training waits per module)
        where.forward(self.global_steps, self.micro_steps, self.module.training)   # for the hang watch
        if self._precision.dtype is not None:
            inputs, kwargs = _cast_floats((inputs, kwargs), self._precision.dtype)
        self._progress.start("fwd")
        self.tput_timer.start()
        if self._flops_profile is not None:
            self._flops_profile.before_forward()
        with self._autocast.forward_context():
            out = self.module(*inputs, **kwargs)
        self._plain_backward.watch(out)   # a plain loss.backward() works as DeepSpeed 0.19.8's (plain_backward.py)
        if self._flops_profile is not None:
            self._flops_profile.after_forward()
        self._progress.stop("fwd")
        return out

    def _require_optimizer(self, what):
        if self.optimizer is None:
            raise NoOptimizerError(
                f"engine.{what}() needs an optimizer, but this engine has none: the model has no trainable "
                "parameters or neither an `optimizer` config section nor initialize(optimizer=...) was given")

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        """Backpropagate `loss` / gradient_accumulation_steps (x the loss scale for fp16); returns `loss` /
        gradient_accumulation_steps (`loss` itself with scale_wrt_gas=False), as DeepSpeed's.

        Gradients are all-reduced only at the accumulation boundary, in buckets, while backward runs."""
        self._require_optimizer("backward")
        self.require_states("backward")
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise ValueError(f"engine.backward expects a scalar loss tensor; got "
                             f"{type(loss).__name__ if not torch.is_tensor(loss) else tuple(loss.shape)}")
        where.backward(self.global_steps, self.micro_steps)
        self._owner.settle(agree=True)   # overlap_step: the last step done; a failure there raised on every rank
        self._progress.start("bwd")
        self._progress.record_loss(loss)
        self.monitor.record_loss(loss)
        scale = self.loss_scale if self._scales_loss else 1.0
        if scale_wrt_gas:
            scale /= self.gradient_accumulation_steps()
        scaled = loss.float() * scale if (scale != 1.0 or loss.dtype != torch.float32) else loss
        self._owner.begin_backward(self._backward_reduces())
        try:
            with engine_backward_running():
                scaled.backward(retain_graph=retain_graph)
        finally:
            self._owner.end_backward()
        self._progress.stop("bwd")
        # as DeepSpeed: the loss divided by the accumulation steps (what was backpropagated, less the fp16 scale)
        gas = self.gradient_accumulation_steps()
        return loss / gas if scale_wrt_gas and gas != 1 else loss

    def scale(self, loss):
        """The loss times the fp16 loss scale, for `engine.scale(loss).backward()` (DeepSpeed 0.19.8): a plain
        backward then divides by the gradient accumulation steps itself. Other precisions: the loss unchanged."""
        self._require_optimizer("scale")
        if not torch.is_tensor(loss) or loss.numel() != 1 or loss.grad_fn is None:
            raise ValueError("engine.scale(loss) needs a scalar loss tensor with a grad_fn; for non-scalar outputs "
                             "call out.backward(grad)")
        self._plain_backward.scaled = True
        return loss.float() * self.loss_scale if self._scales_loss else loss

    def _reduces_every_micro_step(self):
        return self._owner.reduces_every_micro_step

    def _backward_reduces(self):
        """Whether the backward starting now reduces (engine.backward and a plain loss.backward alike); counts it
        for unmanaged accumulation."""
        if self._unmanaged:
            self._in_step = False        # also after a step() that raised
            self._backwards_since_step += 1
            return self._reduces_every_micro_step()
        return self.is_gradient_accumulation_boundary() and not self._no_sync

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally, skipping the all-reduce even at a boundary (like DDP.no_sync)."""
        if self._reduces_every_micro_step():
            raise NoSyncError(f"engine.no_sync() cannot be used with ZeRO stage {self._owner.stage}: the no_sync "
                              "context manager is incompatible with gradient partitioning (gradients are "
                              "partitioned across ranks as they are produced; stages 0 and 1 accumulate locally "
                              "and can skip the reduction)")
        if self._no_sync:
            raise NoSyncError("engine.no_sync() inside engine.no_sync(): no_sync context manager reentry is "
                              "unsupported (as in DeepSpeed); one block already skips the reduction")
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = False

    def step(self, lr_kwargs=None):
        """At the accumulation boundary: unscale, clip, skip on overflow, optimizer + scheduler step."""
        self._require_optimizer("step")
        self.require_states("step")
        if self._no_sync:     # its gradients were never reduced: a step would apply each rank's own
            raise NoSyncError("It is illegal to call Engine.step() inside no_sync context manager: engine.step() "
                              "inside engine.no_sync(); leave the block first (outside it the accumulated gradients "
                              "are reduced before a step applies them)")
        where.call("step", self.global_steps, self.micro_steps)
        self._owner.settle(agree=True)
        self._step_applied = False
        if self._unmanaged:
            self._unmanaged_boundary()
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            self._progress.start("step")
            self._take_model_step(lr_kwargs)
            self._progress.stop("step")
            swapped = self._swapped_this_step()
            self._progress.on_step(self.global_steps, self.global_samples, self.get_lr(), self.loss_scale,
                                   self.skipped_steps, swapped)
            self.monitor.on_step(self.global_samples, self.get_lr(), self.loss_scale if self._scales_loss else None,
                                 swapped)
            if self._flops_profile is not None:
                self._flops_profile.after_step(boundary=True)
            if self.config.memory_breakdown and self._progress.enabled and \
                    self.global_steps % self._progress.every == 0:
                total = self.memory_breakdown()["total"]
                print(f"[dsfast] step {self.global_steps} | model states (rank 0) "
                      + ", ".join(f"{d} {b / 2**20:.1f} MiB" for d, b in total.items()), flush=True)
        self.tput_timer.stop(global_step=boundary)
        self._in_step = False
        self.micro_steps += 1

    def _unmanaged_boundary(self):
        """managed_gradient_accumulation=false: this step() is the boundary. Stages 0-1 accumulated locally in
        every backward; their one reduction runs now (stages 2-3 reduced in each backward)."""
        if not self._reduces_every_micro_step():
            self._owner.prepare_step(self._param_names)    # refuse stray gradients before they are reduced
            self._owner.begin_backward(True)               # a reduction with no backward: every bucket, now
            self._owner.end_backward()
        self._in_step = True

    def _take_model_step(self, lr_kwargs):
        if self._unused_check is not None:
            self._unused_check.check()
        self._owner.prepare_step(self._param_names)
        factor = self._owner.post_reduce_factor
        if self._scales_loss:
            factor /= self.loss_scale
        applied, norm = self._owner.step(self.optimizer, factor, self._clip, self._check_overflow)
        if applied:
            self._global_grad_norm = norm
        self._update_loss_scale(overflow=not applied)
        if applied:
            if self.lr_scheduler is not None:
                self.lr_scheduler.step(**(lr_kwargs or {}))
        else:
            self.skipped_steps += 1
        self._step_applied = applied
        self._owner.zero_grads()
        self.global_steps += 1
        if self._unmanaged:     # the micro-batches actually accumulated, as DeepSpeed counts them
            micro_samples = self.train_batch_size() // self.gradient_accumulation_steps()
            self.global_samples += micro_samples * self._backwards_since_step
            self._backwards_since_step = 0
        else:
            self.global_samples += self.train_batch_size()

    def _update_loss_scale(self, overflow):
        if not self._scales_loss or self.loss_scaler is None:
            if overflow and self.global_rank == 0:
                print(f"[dsfast] step {self.global_steps}: non-finite {self._precision.name} gradients, step "
                      "skipped (bf16.check_grad_overflow)", flush=True)
            return
        before = self.loss_scale
        self.loss_scaler.update_scale(overflow, step=self.global_steps)
        if overflow and self.global_rank == 0:
            print(f"[dsfast] step {self.global_steps}: fp16 gradient overflow, step skipped; loss scale "
                  f"{before:g} -> {self.loss_scale:g}", flush=True)

    # ---- state a checkpoint needs beyond module / optimizer / scheduler ------------------------------------
    def engine_state_dict(self):
        """Counters and loss-scaler state (the checkpoint layer saves this beside model and optimizer states)."""
        return {"global_steps": self.global_steps, "global_samples": self.global_samples,
                "micro_steps": self.micro_steps, "skipped_steps": self.skipped_steps,
                "loss_scaler": self.loss_scaler.state_dict() if self.loss_scaler is not None else None}

    def load_engine_state_dict(self, state):
        for key in ("global_steps", "global_samples", "micro_steps", "skipped_steps"):
            setattr(self, key, int(state[key]))
        if self.loss_scaler is not None and state.get("loss_scaler") is not None:
            self.loss_scaler.load_state_dict(state["loss_scaler"])

    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True, exclude_frozen_parameters=False,
                        *, client_sd=None, async_save=None):
        """DeepSpeed's save_checkpoint, on every rank (client_sd= is the seeds' spelling of client_state)."""
        from dsfast.checkpoint import save_checkpoint
        if client_sd is not None and client_state is not None:
            raise TypeError("save_checkpoint: pass client_state or client_sd (the same thing), not both")
        where.call("save_checkpoint", self.global_steps, self.micro_steps)
        self._owner.settle()
        return save_checkpoint(self, save_dir, tag, client_state if client_state is not None else client_sd,
                               save_latest, async_save=async_save, exclude_frozen_parameters=exclude_frozen_parameters)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False):
        """DeepSpeed's load_checkpoint -> (path, client_state), or (None, None) when there is no checkpoint."""
        from dsfast.checkpoint import load_checkpoint
        where.call("load_checkpoint", self.global_steps, self.micro_steps)
        self._owner.settle()
        return load_checkpoint(self, load_dir, tag, load_module_strict, load_optimizer_states,
                               load_lr_scheduler_states, load_module_only)

    def hold_python_gc(self):
        """disable_python_gc: cyclic GC off while this engine lives (engine/python_gc.py); destroy() ends it, and
        so does the engine's deletion (as DeepSpeed's __del__ does)."""
        import weakref

        from .python_gc import HOLD
        if getattr(self, "_gc_release", None) is None:
            self._gc_release = weakref.finalize(self, HOLD.release, HOLD.acquire())

    def collect_python_gc(self):
        """One gc.collect() now (DeepSpeed's name), whatever disable_python_gc says; returns what it found."""
        import gc
        return gc.collect()

    def destroy(self):
        """Release the engine's hooks and buffers (DeepSpeed's engine.destroy()); the module stays usable."""
        release = getattr(self, "_gc_release", None)
        if release is not None:   # disable_python_gc: this engine's hold ends (once)
            release()
        self._owner.detach()
        for swap in self._owner.swaps:   # NVMe swap files and buffers: gone
            swap.close()
        if getattr(self.module, "_dsfast_owner", None) is self._owner:
            object.__delattr__(self.module, "_dsfast_owner")
        for p in self.module.parameters():
            p.grad = None

    def state_dict(self, *args, **kwargs):
        self._owner.settle()   # overlap_step: the updated values
        return super().state_dict(*args, **kwargs)

    def memory_breakdown(self):
        """Bytes this rank holds per category (params, masters, grads, optimizer_states, comm_buffers) and per
        device ("host" for CPU memory), counted from the tensors themselves; "total" sums them."""
        offloaded = self.offloaded_tensors()   # offload_states(): the host copies
        out = memory_breakdown({**self._owner.memory_tensors(), **({"offloaded": offloaded} if offloaded else {})})
        swaps = self._owner.swaps
        if swaps:   # offload to NVMe: the swap files ("swap_window", "param_swap_window": their host part)
            on_disk = sum(s.nvme_bytes for s in swaps)
            out["nvme_files"] = {"nvme": on_disk}
            out["total"]["nvme"] = on_disk
        return out

    def swap_bytes(self):
        """(bytes read, bytes written) by the NVMe swap since the start, or None without one."""
        swaps = self._owner.swaps
        if not swaps:
            return None
        return sum(s.io.bytes_read for s in swaps), sum(s.io.bytes_written for s in swaps)

    def _swapped_this_step(self):
        now, before = self.swap_bytes(), self._swap_mark
        self._swap_mark = now
        return None if now is None else tuple(a - b for a, b in zip(now, before))

    def zero_grad(self, set_to_none=True):
        """Drop accumulated gradients (the engine also does this after every optimizer step)."""
        self._owner.zero_grads()

    def save_16bit_model(self, save_dir, save_filename="pytorch_model.bin", exclude_frozen_parameters=False):
        """Write the whole model's weights in the model dtype to save_dir/save_filename (rank 0 writes; a
        `.safetensors` name writes that format). Under ZeRO stage 3 the weights are gathered from the partitions
        (call it on every rank) and, as in DeepSpeed, only when zero_optimization.gather_16bit_weights_on_model_save
        is true; otherwise a warning says so and False is returned."""
        from dsfast.checkpoint.model16 import save_16bit_model
        self._owner.settle()
        if self.config.zero_stage == 3 and not self.config.zero_optimization.gather_16bit_weights_on_model_save:
            if self.global_rank == 0:
                print("[dsfast] save_16bit_model: nothing saved: under ZeRO stage 3 set zero_optimization."
                      "gather_16bit_weights_on_model_save (stage3_gather_16bit_weights_on_model_save) to true "
                      "so the partitioned weights are gathered", flush=True)
            return False
        return save_16bit_model(self.module, save_dir, save_filename, exclude_frozen_parameters)


def _cast_floats(obj, dtype):
    """Floating-point fp32 tensors inside (nested) inputs -> the model's half dtype."""
    if torch.is_tensor(obj):
        return obj.to(dtype) if obj.dtype == torch.float32 else obj
    if isinstance(obj, tuple):
        return tuple(_cast_floats(o, dtype) for o in obj)
    if isinstance(obj, list):
        return [_cast_floats(o, dtype) for o in obj]
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    return obj
