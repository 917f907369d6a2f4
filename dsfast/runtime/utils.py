"""deepspeed.runtime.utils: see_memory_usage (a memory report at a point of a program, rank 0, when forced),
move_to_device (tensors in nested containers to a device) and the layer partitioners partition_uniform /
partition_balanced that pipeline-style programs use to split layers into parts; the gradient/weight norm helpers
(clip_grad_norm_, get_global_norm, get_weight_norm) live in grad_norm.py."""
import gc
import resource

import torch
import torch.distributed as dist

from .grad_norm import (clip_grad_norm_, get_global_norm, get_weight_norm, is_invalid_grad_norm,  # noqa: F401
                        is_model_parallel_parameter)

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


def empty_cache():
    """Give the device's cached, unused memory back (torch.cuda.empty_cache on a GPU; nothing to do on the CPU)."""
    from ..accelerator import get_accelerator
    get_accelerator().empty_cache()


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


def move_to_device(item, device, criterion_func=None):
    """`item` (a tensor, or lists / tuples / dicts of them, nested) on `device`, as new containers of copies;
    leaves without .to pass through. A leaf for which criterion_func is true is moved in place instead (its .data
    swapped: the same tensor object, a parameter say, now lives on `device`)."""
    if criterion_func is not None and criterion_func(item):
        item.data = item.to(device).data
        return item
    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    return item.to(device) if hasattr(item, "to") else item


def prefix_sum_inc(weights):
    """Inclusive prefix sums: [3, 4, 5] -> [3, 7, 12]."""
    out, total = [], 0
    for w in weights:
        total = total + w
        out.append(total)
    return out


def _check_parts(num_parts):
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts < 1:
        raise ValueError(f"num_parts must be a positive int, got {num_parts!r}")


def partition_uniform(num_items, num_parts):
    """Boundaries (num_parts + 1 of them, 0 .. num_items) of num_items split as evenly as possible, the first
    parts one larger when it does not divide; with fewer items than parts, one item per part, the rest empty."""
    _check_parts(num_parts)
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, extra = divmod(num_items, num_parts)
    return [p * size + min(p, extra) for p in range(num_parts + 1)]


def partition_balanced(weights, num_parts):
    """Boundaries (num_parts + 1 of them) splitting `weights` into contiguous parts whose sums are close: DeepSpeed's
    dynamic programme over (items, parts), which keeps for each prefix the split with the smallest spread
    (largest part sum - smallest), ties going to the split whose last part starts latest. Fewer items than
    parts: partition_uniform."""
    _check_parts(num_parts)
    n = len(weights)
    if n <= num_parts:
        return partition_uniform(n, num_parts)
    inf = float("inf")
    sums = [0.0] + [float(s) for s in prefix_sum_inc(weights)]
    # best[j][i]: (spread, largest, smallest, start of the last part) over the first i items in j parts
    best = [[(inf, inf, inf, 0)] * (n + 1) for _ in range(num_parts + 1)]
    best[0][0] = (0.0, 0.0, inf, 0)
    for i in range(1, n + 1):
        for j in range(1, min(i, num_parts) + 1):
            chosen = best[j][i]
            for k in range(i):
                _, prev_max, prev_min, _ = best[j - 1][k]
                part = sums[i] - sums[k]
                hi, lo = max(prev_max, part), min(prev_min, part)
                if hi - lo <= chosen[0]:
                    chosen = (hi - lo, hi, lo, k)
            best[j][i] = chosen
    bounds = [n]
    for j in range(num_parts, 0, -1):
        bounds.append(best[j][bounds[-1]][3])
    return bounds[::-1]
