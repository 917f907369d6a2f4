"""The CPU accelerator, as DeepSpeed's CPU_Accelerator behaves: device "cpu", backend gloo, memory figures are
the process's resident set size (peak = the largest RSS seen by a memory query since the last reset)."""
import contextlib
import os

import torch

from .base import Accelerator


def process_rss():
    """Resident set size of this process in bytes (psutil when installed, /proc otherwise; 0 if neither)."""
    try:
        import psutil
        return psutil.Process().memory_info().rss
    except ImportError:
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _host_memory():
    """(total, available) bytes of host memory; (0, 0) when the system does not say."""
    try:
        import psutil
        vm = psutil.virtual_memory()
        return vm.total, vm.available
    except ImportError:
        pass
    try:
        fields = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, value = line.split(":", 1)
                fields[key] = int(value.split()[0]) * 1024
        return fields["MemTotal"], fields.get("MemAvailable", fields.get("MemFree", 0))
    except (OSError, ValueError, KeyError):
        return 0, 0


def numa_node_count(root="/sys/devices/system/node"):
    """NUMA nodes that have CPUs (DeepSpeed counts one CPU 'device' per such node); 1 when unknown."""
    try:
        names = [n for n in os.listdir(root) if n.startswith("node") and n[4:].isdigit()]
    except OSError:
        return 1
    count = 0
    for name in names:
        try:
            with open(os.path.join(root, name, "cpulist")) as f:
                count += bool(f.read().strip())
        except OSError:
            continue
    return count or 1


class CpuAccelerator(Accelerator):
    _name = "cpu"

    def __init__(self):
        # DeepSpeed uses oneCCL when its torch bindings are installed, gloo otherwise
        try:
            import oneccl_bindings_for_pytorch  # noqa: F401
            self._communication_backend_name = "ccl"
        except ImportError:
            self._communication_backend_name = "gloo"
        self.max_mem = process_rss()

    # ------------------------------------------------------------------ device
    def is_synchronized_device(self):
        return True

    def device_name(self, device_index=None):
        return "cpu"

    def device(self, device_index=None):
        # DeepSpeed returns None here (tensor.to(None) is a no-op); torch.device("cpu") works the same way
        return torch.device("cpu")

    def set_device(self, device_index):
        return None

    def current_device(self):
        # DeepSpeed returns LOCAL_RANK unconverted (a str when set); an int is what callers compare with
        return int(os.environ.get("LOCAL_RANK", 0))

    def current_device_name(self):
        return "cpu"

    def device_count(self):
        local_size = int(os.environ.get("LOCAL_SIZE", 0))
        return local_size if local_size > 0 else numa_node_count()

    def is_available(self):
        return True

    def synchronize(self, device_index=None):
        return None

    # ------------------------------------------------------------------ RNG
    def set_rng_state(self, new_state, device_index=None):
        return torch.set_rng_state(new_state)

    def get_rng_state(self, device_index=None):
        return torch.get_rng_state()

    def manual_seed(self, seed):
        return torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        return torch.manual_seed(seed)

    def default_generator(self, device_index=None):
        return torch.default_generator

    # ------------------------------------------------------------------ streams / events: none on the CPU
    @property
    def Stream(self):
        return None

    def stream(self, stream):
        return contextlib.nullcontext()

    def current_stream(self, device_index=None):
        return None

    def default_stream(self, device_index=None):
        return None

    @property
    def Event(self):
        return None

    # ------------------------------------------------------------------ memory (process RSS, as DeepSpeed)
    def _rss(self):
        mem = process_rss()
        self.max_mem = max(self.max_mem, mem)
        return mem

    def _reset_peak(self, device_index=None):
        self.max_mem = process_rss()

    def empty_cache(self):
        return None

    def memory_allocated(self, device_index=None):
        return self._rss()

    def max_memory_allocated(self, device_index=None):
        self._rss()
        return self.max_mem

    memory_cached = memory_reserved = memory_allocated
    max_memory_cached = max_memory_reserved = max_memory_allocated
    reset_max_memory_allocated = reset_max_memory_cached = reset_peak_memory_stats = _reset_peak

    def memory_stats(self, device_index=None):
        mem = self._rss()
        return {"allocated_bytes.all.current": mem, "allocated_bytes.all.peak": self.max_mem}

    def total_memory(self, device_index=None):
        return _host_memory()[0]

    def available_memory(self, device_index=None):
        return _host_memory()[1]

    # ------------------------------------------------------------------ dtypes
    def is_bf16_supported(self):
        return True

    def is_fp16_supported(self):
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
        except (AttributeError, RuntimeError):
            return False

    def supported_dtypes(self):
        # DeepSpeed's order for the CPU: fp32, bf16, then fp16 where oneDNN has it
        return [torch.float32, torch.bfloat16] + ([torch.float16] if self.is_fp16_supported() else [])

    def amp(self):
        return torch.cpu.amp

    # ------------------------------------------------------------------ tensor types (the legacy CPU classes)
    BFloat16Tensor = property(lambda self: torch.BFloat16Tensor)
    ByteTensor = property(lambda self: torch.ByteTensor)
    DoubleTensor = property(lambda self: torch.DoubleTensor)
    FloatTensor = property(lambda self: torch.FloatTensor)
    HalfTensor = property(lambda self: torch.HalfTensor)
    IntTensor = property(lambda self: torch.IntTensor)
    LongTensor = property(lambda self: torch.LongTensor)

    # ------------------------------------------------------------------ pinning: nothing to pin to
    def _pin(self, tensor):
        return tensor

    def _pin_empty(self, template, shape):
        return template.new_empty(shape)

