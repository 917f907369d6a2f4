"""This node's visible CUDA devices, found without importing torch (keeps `dsfast` start-up fast).

Slot ids are positions in the node's visible device list: with CUDA_VISIBLE_DEVICES unset they are the physical
GPU indices; with CUDA_VISIBLE_DEVICES=2,3 slot 0 is GPU 2 and slot 1 is GPU 3 (the variable is honoured, UUIDs too).
"""
import os
import re
from typing import List, Mapping, Optional, Sequence

_NVIDIA_PROC = "/proc/driver/nvidia/gpus"
_DEV_DIR = "/dev"
_NVIDIA_DEV = re.compile(r"^nvidia\d+$")


def physical_gpu_count() -> int:
    """NVIDIA GPUs of this machine: the driver's /proc entries, else the /dev/nvidiaN nodes (some containers)."""
    try:
        return len(os.listdir(_NVIDIA_PROC))
    except OSError:
        pass
    try:
        return sum(1 for name in os.listdir(_DEV_DIR) if _NVIDIA_DEV.match(name))
    except OSError:
        return 0


def visible_devices(environ: Mapping[str, str], physical: Optional[int] = None) -> List[str]:
    """The device names CUDA would show this process, in order (empty list on a machine without GPUs)."""
    physical = physical_gpu_count() if physical is None else physical
    if physical == 0:
        return []
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return [str(i) for i in range(physical)]
    out = []
    for tok in cvd.split(","):
        tok = tok.strip()
        if not tok or tok.startswith("-"):  # CUDA stops at the first invalid entry
            break
        out.append(tok)
    return out


def devices_for_slots(slots: Sequence[int], visible: Sequence[str]) -> List[str]:
    """CUDA_VISIBLE_DEVICES entries for a node's slots; LOCAL_RANK i then addresses cuda:i = the i-th slot."""
    missing = [s for s in slots if s >= len(visible)]
    if missing:
        raise IndexError(f"slots {missing} but this node sees {len(visible)} GPU(s): {','.join(visible) or 'none'}")
    return [visible[s] for s in slots]
