"""Restricted unpickling of DeepSpeed's .pt files: torch's weights_only loader plus inert stand-ins for the few
DeepSpeed classes those pickles name. No DeepSpeed import, no code from the file runs; any other global is refused
(torch's error names it)."""
import enum

import torch

from .errors import CheckpointCorruptError


class _Record:
    """A plain attribute bag that takes positional/keyword arguments and pickled state."""
    _fields = ()

    def __init__(self, *args, **kwargs):
        for name, value in zip(self._fields, args):
            setattr(self, name, value)
        self.__dict__.update(kwargs)

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:   # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)

    def __repr__(self):
        return f"{type(self).__name__}({self.__dict__})"


def _stand_in(module, name, base=_Record, fields=()):
    cls = type(name, (base,), {"_fields": fields, "__module__": module, "__qualname__": name})
    return cls


class _ZeroStage(enum.IntEnum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


_ZeroStage.__module__ = "deepspeed.runtime.zero.config"
_ZeroStage.__qualname__ = _ZeroStage.__name__ = "ZeroStageEnum"

STAND_INS = [
    _ZeroStage,
    _stand_in("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    _stand_in("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    _stand_in("deepspeed.utils.tensor_fragment", "fragment_address", fields=("numel", "start")),
    _stand_in("deepspeed.checkpoint.utils", "clone_tensors_for_torch_save"),
]


def ds_load(path):
    """torch.load(path) with only tensors, containers and the stand-ins allowed. The tensors are memory-mapped
    (torch's zip format, what DeepSpeed writes): a reader of one parameter's fragment reads only its pages."""
    extra = [getattr(torch, "Size")]
    try:
        with torch.serialization.safe_globals(STAND_INS + extra):
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as err:      # the legacy (non-zip) format cannot be mapped: read it whole
                if "mmap" not in str(err):
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path}: missing") from None
    except Exception as err:   # UnpicklingError (a refused global), zip errors (a truncated file), ...
        raise CheckpointCorruptError(f"{path}: cannot be read as a DeepSpeed checkpoint file without running its "
                                     f"code ({type(err).__name__}: {str(err).splitlines()[0][:300]})") from None
