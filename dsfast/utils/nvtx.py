"""deepspeed.utils.nvtx: instrument_w_nvtx, a decorator that marks each call of a function as a named range on the
device's profiler timeline (NVTX on a GPU, seen in Nsight Systems; nothing on the CPU)."""
import functools


def instrument_w_nvtx(func):
    """func, each call wrapped in a range named after its qualified name."""
    @functools.wraps(func)
    def ranged(*args, **kwargs):
        from ..accelerator import get_accelerator
        accelerator = get_accelerator()
        accelerator.range_push(func.__qualname__)
        try:
            return func(*args, **kwargs)
        finally:
            accelerator.range_pop()
    return ranged


__all__ = ["instrument_w_nvtx"]
