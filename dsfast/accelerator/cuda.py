"""The CUDA accelerator: thin names over torch.cuda, as DeepSpeed's CUDA_Accelerator."""
import functools
import os

import torch

from .base import Accelerator


def _cuda_tensor(dtype):
    return property(lambda self: functools.partial(torch.tensor, dtype=dtype, device="cuda"))


class CudaAccelerator(Accelerator):
    _name = "cuda"
    _communication_backend_name = "nccl"

    # ------------------------------------------------------------------ device
    def is_synchronized_device(self):
        return False

    def device_name(self, device_index=None):
        return "cuda" if device_index is None else f"cuda:{device_index}"

    def device(self, device_index=None):
        return torch.device("cuda", device_index)

    def set_device(self, device_index):
        torch.cuda.set_device(device_index)

    def current_device(self):
        return torch.cuda.current_device()

    def current_device_name(self):
        return f"cuda:{torch.cuda.current_device()}"

    def device_count(self):
        return torch.cuda.device_count()

    def is_available(self):
        return torch.cuda.is_available()

    def synchronize(self, device_index=None):
        return torch.cuda.synchronize(device_index)

    def on_accelerator(self, tensor):
        return tensor.device.type == "cuda"

    def communication_backend_version(self):
        return torch.cuda.nccl.version()

    def export_envs(self):
        return ["NCCL"]

    # ------------------------------------------------------------------ RNG
    def set_rng_state(self, new_state, device_index=None):
        if device_index is None:
            return torch.cuda.set_rng_state(new_state)
        return torch.cuda.set_rng_state(new_state, device_index)

    def get_rng_state(self, device_index=None):
        if device_index is None:
            return torch.cuda.get_rng_state()
        return torch.cuda.get_rng_state(device_index)

    def manual_seed(self, seed):
        return torch.cuda.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.cuda.manual_seed_all(seed)

    def initial_seed(self):
        return torch.cuda.initial_seed()

    def default_generator(self, device_index=None):
        torch.cuda.init()   # the per-device generators exist only after CUDA is initialised
        index = torch.cuda.current_device() if device_index is None else device_index
        return torch.cuda.default_generators[index]

    # ------------------------------------------------------------------ streams / events
    @property
    def Stream(self):
        return torch.cuda.Stream

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device_index=None):
        return torch.cuda.current_stream(device_index)

    def default_stream(self, device_index=None):
        return torch.cuda.default_stream(device_index)

    @property
    def Event(self):
        return torch.cuda.Event

    # ------------------------------------------------------------------ memory
    def empty_cache(self):
        return torch.cuda.empty_cache()

    def memory_allocated(self, device_index=None):
        return torch.cuda.memory_allocated(device_index)

    def max_memory_allocated(self, device_index=None):
        return torch.cuda.max_memory_allocated(device_index)

    def reset_max_memory_allocated(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_cached(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    def max_memory_cached(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    def reset_max_memory_cached(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_stats(self, device_index=None):
        return torch.cuda.memory_stats(device_index)

    def reset_peak_memory_stats(self, device_index=None):
        return torch.cuda.reset_peak_memory_stats(device_index)

    def memory_reserved(self, device_index=None):
        return torch.cuda.memory_reserved(device_index)

    def max_memory_reserved(self, device_index=None):
        return torch.cuda.max_memory_reserved(device_index)

    def total_memory(self, device_index=None):
        index = torch.cuda.current_device() if device_index is None else device_index
        return torch.cuda.get_device_properties(index).total_memory

    def available_memory(self, device_index=None):
        # the driver's free figure (other processes' use included), as DeepSpeed gets it through NVML
        free, _ = torch.cuda.mem_get_info(device_index)
        return free

    # ------------------------------------------------------------------ dtypes
    def is_bf16_supported(self):
        return True if not torch.cuda.is_available() else torch.cuda.is_bf16_supported()

    def is_fp16_supported(self):
        if not torch.cuda.is_available():
            return True
        # DeepSpeed: compute capability 7+ (6.x only with DS_ALLOW_DEPRECATED_FP16=1)
        major, _ = torch.cuda.get_device_capability()
        return major >= 7 or (major == 6 and os.environ.get("DS_ALLOW_DEPRECATED_FP16", "0") == "1")

    def is_triton_supported(self):
        return self.is_available() and torch.cuda.get_device_capability()[0] >= 8

    def amp(self):
        return torch.cuda.amp

    # ------------------------------------------------------------------ graphs
    def is_current_stream_capturing(self):
        return torch.cuda.is_current_stream_capturing()

    def create_graph(self):
        return torch.cuda.CUDAGraph()

    def capture_to_graph(self, graph, pool=None, stream=None):
        return torch.cuda.graph(graph, pool, stream)

    def replay_graph(self, graph):
        graph.replay()

    # ------------------------------------------------------------------ tensor factories on the GPU
    BFloat16Tensor = _cuda_tensor(torch.bfloat16)
    ByteTensor = _cuda_tensor(torch.uint8)
    DoubleTensor = _cuda_tensor(torch.float64)
    FloatTensor = _cuda_tensor(torch.float32)
    HalfTensor = _cuda_tensor(torch.float16)
    IntTensor = _cuda_tensor(torch.int32)
    LongTensor = _cuda_tensor(torch.int64)

    # ------------------------------------------------------------------ pinning
    def _pin(self, tensor):
        return tensor.pin_memory()

    def _pin_empty(self, template, shape):
        return template.new_empty(shape, pin_memory=True)

    def range_push(self, msg, domain=None, category=None):
        return torch.cuda.nvtx.range_push(msg)

    def range_pop(self, domain=None):
        return torch.cuda.nvtx.range_pop()

    def lazy_call(self, callback):
        return torch.cuda._lazy_call(callback)


def synchronize_if_used():
    """Wait for queued CUDA work when this process has used CUDA at all (never initialises it)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
