"""client_state / scheduler state <-> JSON plus named tensors: nothing that loading would have to unpickle.

Allowed: None, bool, int, float (nan/inf too), str, list, tuple, dict with str keys, torch.Tensor (stored in a
safetensors file), torch.dtype, torch.Size. Anything else is refused at save time, naming its key path.
Tuples, tensors and dtypes are tagged objects in the JSON ({"__tuple__": [...]}, ...) so they come back as such.
"""
import torch

from .errors import UnsafeStateError

_MARKERS = ("__tuple__", "__tensor__", "__dtype__", "__size__")


def encode(obj, where, tensors, prefix):
    """JSON-able form of `obj`; its tensors go into `tensors` under `prefix`-based names."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, float)) and type(obj) in (int, float):
        return obj
    if isinstance(obj, torch.Size):
        return {"__size__": list(obj)}
    if torch.is_tensor(obj):
        key = f"{prefix}{len(tensors)}"
        tensors[key] = obj.detach().cpu()
        return {"__tensor__": key}
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).replace("torch.", "")}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode(v, f"{where}[{i}]", tensors, prefix) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [encode(v, f"{where}[{i}]", tensors, prefix) for i, v in enumerate(obj)]
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise UnsafeStateError(f"{where} has the key {k!r} of type {type(k).__name__}; checkpoint state is "
                                       "stored as JSON, whose keys are strings: use str keys")
            if k in _MARKERS:
                raise UnsafeStateError(f"{where}[{k!r}]: the key {k!r} is reserved by dsfast's checkpoint format")
            out[k] = encode(v, f"{where}[{k!r}]", tensors, prefix)
        return out
    import numpy as np
    if isinstance(obj, np.generic):
        return encode(obj.item(), where, tensors, prefix)
    if isinstance(obj, np.ndarray):
        return encode(torch.from_numpy(obj.copy()), where, tensors, prefix)
    raise UnsafeStateError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which a checkpoint cannot store without "
        "pickling (loading would run code). Store plain values instead: numbers, strings, lists, tuples, dicts "
        "with str keys, tensors (e.g. its state_dict() or str(value))")


def decode(obj, tensors):
    if isinstance(obj, list):
        return [decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1:
            (k, v), = obj.items()
            if k == "__tuple__":
                return tuple(decode(x, tensors) for x in v)
            if k == "__tensor__":
                return tensors[v]
            if k == "__dtype__":
                dtype = getattr(torch, str(v), None)
                if not isinstance(dtype, torch.dtype):
                    raise ValueError(f"checkpoint state names an unknown dtype {v!r}")
                return dtype
            if k == "__size__":
                return torch.Size(v)
        return {k: decode(v, tensors) for k, v in obj.items()}
    return obj
