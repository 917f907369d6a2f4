"""deepspeed.runtime.utils.see_memory_usage: a memory report at a point of a program (rank 0, when forced)."""
import gc
import resource

import torch
import torch.distributed as dist

GIB = 1024 ** 3


def _host_rss_gib():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB   # peak, where /proc is missing


def see_memory_usage(message, force=False):
    """DeepSpeed prints this only with force=True, on rank 0: the message, then the accelerator's allocated and
    reserved memory (current and peak) and this process's host memory. Returns the line printed (or None)."""
    if not force or (dist.is_initialized() and dist.get_rank() != 0):
        return None
    gc.collect()
    parts = [message]
    if torch.cuda.is_available():
        c = torch.cuda
        parts.append(f"MA {c.memory_allocated() / GIB:.2f} GB  Max_MA {c.max_memory_allocated() / GIB:.2f} GB  "
                     f"CA {c.memory_reserved() / GIB:.2f} GB  Max_CA {c.max_memory_reserved() / GIB:.2f} GB")
        c.reset_peak_memory_stats()
    parts.append(f"host RSS {_host_rss_gib():.2f} GB")
    line = " | ".join(parts)
    print(line, flush=True)
    return line
