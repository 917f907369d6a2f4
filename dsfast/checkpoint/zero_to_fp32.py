"""DeepSpeed's zero_to_fp32 (re-exported at deepspeed.utils.zero_to_fp32 by dsfast/utils/zero_to_fp32.py): a ZeRO
checkpoint (dsfast's or DeepSpeed's) -> one full fp32 state_dict, on CPU, without a process group
(dsfast.checkpoint.consolidate does the work; `dsfast consolidate` is its command), and the file listings programs
use to inspect a tag folder (get_optim_files: one file per data-parallel rank)."""
import glob
import os
import re

import torch

from .consolidate import consolidate
from .constants import MODEL_FILE_SUFFIX, OPTIM_FILE_SUFFIX
from .manifest import MODEL_FILE


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False,
                                             lazy_mode=False):
    """{name: fp32 tensor} of the checkpoint in checkpoint_dir (the tag `latest` names when tag is None).
    lazy_mode (DeepSpeed's): {name: LazyTensor} instead, nothing read yet; each one's .contiguous() reads that
    tensor alone from the slices that hold it (a tied weight's names share one LazyTensor, as they share a tensor
    in the eager dict). Every input file is checked first in both modes."""
    if not lazy_mode:
        return consolidate(checkpoint_dir, tag, exclude_frozen=exclude_frozen_parameters)
    from .consolidate import entries
    found, check = entries(checkpoint_dir, tag, exclude_frozen_parameters)
    check()
    out = {}
    for e in found:
        out[e.name] = out[e.alias_of] if e.alias_of is not None else LazyTensor(e)
    return out


class LazyTensor:
    """DeepSpeed's lazy_mode placeholder: shape and dtype now, the values at .contiguous() (a fresh tensor each
    call; keep it only while needed, which is the point)."""

    def __init__(self, entry):
        self._entry = entry
        self.shape, self.dtype = torch.Size(entry.shape), entry.dtype

    def numel(self):
        return self._entry.numel

    def contiguous(self):
        return self._entry.fetch()

    def __repr__(self):
        return f"LazyTensor({self._entry.name!r}, shape={tuple(self.shape)}, dtype={self.dtype})"


def convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, dtype=torch.float32, max_shard_size="5GB",
                                          safe_serialization=False, tag=None, exclude_frozen_parameters=False):
    """Writes the consolidated weights into output_dir as DeepSpeed 0.19.8 does: pytorch_model.bin (torch.save) or
    model.safetensors, floating-point tensors in `dtype`; past max_shard_size (default "5GB"; None: one file),
    numbered files plus their index JSON, split as huggingface_hub's split_torch_state_dict_into_shards splits.
    Streamed (dsfast.checkpoint.export_hf): safetensors one tensor in memory at a time, torch files one file at a
    time; every input file is checked before anything is written, the output appears only when complete. In
    safetensors a tied weight is written once (its first name), as save_pretrained writes it."""
    from .consolidate import entries
    from .export_hf import output_dtype, parse_max_shard_size, write_hf_dir
    dtype = output_dtype(dtype)
    if max_shard_size is not None:
        parse_max_shard_size(max_shard_size)
    found, check = entries(checkpoint_dir, tag, exclude_frozen_parameters)
    check()
    write_hf_dir(found, output_dir, dtype, max_shard_size,
                 weights_name="model.safetensors" if safe_serialization else "pytorch_model.bin",
                 torch_format=not safe_serialization)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization=False, tag=None, exclude_frozen_parameters=False):
    """convert_zero_checkpoint_to_state_dict in fp32 (DeepSpeed's older name, same arguments but dtype)."""
    return convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, torch.float32, max_shard_size,
                                                 safe_serialization, tag, exclude_frozen_parameters)


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Loads the checkpoint's fp32 weights into `model` (moved to the CPU first, as DeepSpeed does); returns it."""
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(sd, strict=False)
    return model


def _natural_key(path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def get_checkpoint_files(checkpoint_dir, glob_pattern):
    """The files of checkpoint_dir matching glob_pattern, in natural order (rank 2 before rank 10)."""
    found = sorted(glob.glob(os.path.join(checkpoint_dir, glob_pattern)), key=_natural_key)
    if not found:
        raise FileNotFoundError(f"can't find {glob_pattern} files in directory '{checkpoint_dir}'")
    return found


def _files(checkpoint_dir, deepspeed_pattern, dsfast_pattern):
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(f"Directory '{checkpoint_dir}' doesn't exist")
    for pattern in (deepspeed_pattern, dsfast_pattern):
        if glob.glob(os.path.join(checkpoint_dir, pattern)):
            return get_checkpoint_files(checkpoint_dir, pattern)
    raise FileNotFoundError(f"can't find {deepspeed_pattern} (a DeepSpeed checkpoint) or {dsfast_pattern} (a dsfast "
                            f"checkpoint) files in directory '{checkpoint_dir}': give the tag folder (e.g. "
                            "<save_dir>/global_step100), not the save_dir")


def get_optim_files(checkpoint_dir):
    """The optimizer-state files of a tag folder, one per data-parallel rank that saved it: DeepSpeed's
    *_optim_states.pt, or dsfast's optim_rank*.safetensors."""
    return _files(checkpoint_dir, f"*{OPTIM_FILE_SUFFIX}", "optim_rank*.safetensors")


def get_model_state_files(checkpoint_dir):
    """The model-state files of a tag folder: DeepSpeed's *_model_states.pt (one per rank at stage 3), or dsfast's
    one model file."""
    return _files(checkpoint_dir, f"*{MODEL_FILE_SUFFIX}", MODEL_FILE)


__all__ = ["get_checkpoint_files", "get_optim_files", "get_model_state_files",
           "get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_state_dict",
           "convert_zero_checkpoint_to_fp32_state_dict", "load_state_dict_from_zero_checkpoint"]
