"""What every dsfast accelerator shares: DeepSpeed's accelerator interface where the answer does not depend on
the device (RNG module, pinning, timers, op builders). cpu.py and cuda.py fill in the device-specific part."""
import abc
import contextlib

import torch


class Accelerator(abc.ABC):
    """DeepSpeed's `DeepSpeedAccelerator` interface (deepspeed.accelerator.abstract_accelerator), for the
    devices dsfast runs on. `_name` and `_communication_backend_name` are read by DeepSpeed programs too."""

    _name = None
    _communication_backend_name = None
    _compile_backend = "inductor"
    supports_nvtx_domain = False   # range_push/range_pop take no NVTX domain here

    # ------------------------------------------------------------------ device
    @abc.abstractmethod
    def device_name(self, device_index=None): ...

    @abc.abstractmethod
    def device(self, device_index=None): ...

    @abc.abstractmethod
    def set_device(self, device_index): ...

    @abc.abstractmethod
    def current_device(self): ...

    @abc.abstractmethod
    def current_device_name(self): ...

    @abc.abstractmethod
    def device_count(self): ...

    @abc.abstractmethod
    def is_available(self): ...

    @abc.abstractmethod
    def synchronize(self, device_index=None): ...

    @abc.abstractmethod
    def is_synchronized_device(self): ...

    # A synchronized device (the CPU) runs everything in program order: host timers are exact there.
    def use_host_timers(self):
        return self.is_synchronized_device()

    def resolves_data_dependency(self):
        return self.is_synchronized_device()

    def handles_memory_backpressure(self):
        return self.is_synchronized_device()

    def on_accelerator(self, tensor):
        return tensor.device.type == self._name

    # ------------------------------------------------------------------ RNG
    def random(self):
        return torch.random

    def initial_seed(self):
        return torch.initial_seed()

    # ------------------------------------------------------------------ misc
    def communication_backend_name(self):
        return self._communication_backend_name

    def is_fp64_supported(self):
        return True

    def supported_dtypes(self):
        out = [torch.float32]
        if self.is_fp16_supported():
            out.append(torch.float16)
        if self.is_bf16_supported():
            out.append(torch.bfloat16)
        return out

    def range_push(self, msg, domain=None, category=None):
        return None

    def range_pop(self, domain=None):
        return None

    def lazy_call(self, callback):
        return callback()

    def is_triton_supported(self):
        return False

    def export_envs(self):
        return []

    def visible_devices_envs(self):
        return ["CUDA_VISIBLE_DEVICES"]

    def set_visible_devices_envs(self, current_env, local_accelerator_ids):
        for env in self.visible_devices_envs():
            current_env[env] = ",".join(map(str, local_accelerator_ids))

    def get_compile_backend(self):
        return self._compile_backend

    def set_compile_backend(self, backend):
        supported = torch._dynamo.list_backends(exclude_tags=())
        if backend not in supported:
            raise ValueError(f"compile backend {backend!r} is not available on {self._name}; "
                             f"available: {', '.join(supported)}")
        self._compile_backend = backend

    # ------------------------------------------------------------------ pinned host memory
    def pin_memory(self, tensor, make_copy=True, match_shape=True):
        """A page-locked copy of `tensor` (make_copy) or a fresh page-locked buffer of its dtype and shape
        (numel only with match_shape=False), as DeepSpeed's pin_memory does."""
        if make_copy:
            return self._pin(tensor)
        shape = tensor.shape if match_shape else (tensor.numel(),)
        return self._pin_empty(tensor, shape)

    def pin_empty(self, *size, dtype, device="cpu"):
        if torch.device(device).type != "cpu":
            raise ValueError(f"pin_empty allocates host memory; device must be cpu, got {device!r}")
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
        return self._pin_empty(torch.empty(0, dtype=dtype), shape)

    def pin_empty_like(self, tensor, device="cpu", dtype=None):
        if torch.device(device).type != "cpu":
            raise ValueError(f"pin_empty_like allocates host memory; device must be cpu, got {device!r}")
        return self._pin_empty(tensor.new_empty((0,), dtype=dtype or tensor.dtype, device="cpu"),
                               tuple(tensor.shape))

    def is_pinned(self, tensor):
        return tensor.is_pinned()

    def unpin_memory(self, tensor):
        return None

    def pin_memory_alignment(self):
        return 1

    def register_host_memory(self, address, num_bytes):
        return False

    def unregister_host_memory(self, address):
        return None

    @abc.abstractmethod
    def _pin(self, tensor): ...

    @abc.abstractmethod
    def _pin_empty(self, template, shape): ...

    # ------------------------------------------------------------------ graphs (CUDA graphs; none elsewhere)
    def is_current_stream_capturing(self):
        return False

    def create_graph(self):
        return None

    def capture_to_graph(self, graph, pool=None, stream=None):
        return contextlib.nullcontext()

    def replay_graph(self, graph):
        return None

    # ------------------------------------------------------------------ op builders
    def op_builder_dir(self):
        return "dsfast.ops.op_builder"

    def get_op_builder(self, class_name):
        """DeepSpeed's builder class of that name, over dsfast's ops (dsfast.ops.op_builder)."""
        from ..ops.op_builder import builder_class
        return builder_class(class_name)

    def create_op_builder(self, class_name):
        return self.get_op_builder(class_name)()

    def build_extension(self):
        from torch.utils.cpp_extension import BuildExtension
        return BuildExtension

    def __repr__(self):
        return f"<dsfast {self._name} accelerator (communication backend {self._communication_backend_name})>"


# DeepSpeed's name for the base class (isinstance checks and subclasses in user code).
DeepSpeedAccelerator = Accelerator
