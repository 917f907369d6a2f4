"""Which accelerator this process uses: DS_ACCELERATOR when set ("cuda" or "cpu"), else CUDA when torch can use
a GPU, else the CPU (DeepSpeed's rule for the devices dsfast runs on). Chosen once, then cached."""
import os

import torch

from .base import Accelerator

SUPPORTED = ("cuda", "cpu")
# DeepSpeed accelerators dsfast does not provide (named in the error so the message says why).
DEEPSPEED_ONLY = ("xpu", "npu", "mps", "hpu", "mlu", "sdaa", "supa", "klxpu")

_current = None


class AcceleratorError(ValueError):
    """DS_ACCELERATOR names an accelerator dsfast cannot provide here."""


def select_accelerator(env=None):
    """A fresh accelerator chosen from `env` (os.environ by default); get_accelerator() caches this."""
    env = os.environ if env is None else env
    name = env.get("DS_ACCELERATOR")
    if name is None:
        name = "cuda" if torch.cuda.device_count() > 0 and torch.cuda.is_available() else "cpu"
    elif name not in SUPPORTED:
        why = ("a DeepSpeed accelerator dsfast does not support" if name in DEEPSPEED_ONLY
               else "not an accelerator name")
        raise AcceleratorError(f"DS_ACCELERATOR={name!r} is {why}; dsfast supports DS_ACCELERATOR=cuda or "
                               "DS_ACCELERATOR=cpu (or leave it unset: cuda when a GPU is usable, else cpu)")
    elif name == "cuda" and not torch.cuda.is_available():
        build = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise AcceleratorError(f"DS_ACCELERATOR=cuda but {build}; use DS_ACCELERATOR=cpu or unset it")
    if name == "cuda":
        from .cuda import CudaAccelerator
        return CudaAccelerator()
    from .cpu import CpuAccelerator
    return CpuAccelerator()


def get_accelerator():
    """The process's accelerator (DeepSpeed's deepspeed.accelerator.get_accelerator())."""
    global _current
    if _current is None:
        _current = select_accelerator()
    return _current


def set_accelerator(accel):
    """Use `accel` from now on (DeepSpeed's set_accelerator); it must be a dsfast Accelerator."""
    global _current
    if not isinstance(accel, Accelerator):
        raise TypeError(f"set_accelerator() needs a dsfast.accelerator.Accelerator (e.g. CpuAccelerator() or "
                        f"CudaAccelerator()), got {type(accel).__name__}")
    _current = accel


def is_current_accelerator_supported():
    return get_accelerator().device_name() in SUPPORTED
