"""deepspeed.utils.zero_to_fp32: a ZeRO checkpoint (dsfast's or DeepSpeed's) -> one full fp32 state_dict, on CPU,
without a process group (dsfast.checkpoint.consolidate does the work; `dsfast consolidate` is its command), and the
file listings programs use to inspect a tag folder (get_optim_files: one file per data-parallel rank)."""
import glob
import json
import os
import re

import torch

from ..checkpoint.manifest import MODEL_FILE
from ..checkpoint.safetensors_io import write_file

from ..checkpoint.consolidate import consolidate


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False,
                                             lazy_mode=False):
    """{name: fp32 tensor} of the checkpoint in checkpoint_dir (the tag `latest` names when tag is None).
    lazy_mode: DeepSpeed then returns placeholders that .contiguous() turns into tensors; these are tensors
    already, which .contiguous() returns as they are."""
    return consolidate(checkpoint_dir, tag, exclude_frozen=exclude_frozen_parameters)


_OUTPUT_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
                  "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def _output_dtype(dtype):
    name = dtype[len("torch."):] if isinstance(dtype, str) and dtype.startswith("torch.") else dtype
    found = _OUTPUT_DTYPES.get(name.lower()) if isinstance(name, str) else name
    if found not in _OUTPUT_DTYPES.values():
        raise ValueError(f"Unsupported output dtype {dtype!r}. Choose one of: {', '.join(sorted(_OUTPUT_DTYPES))}")
    return found


def convert_zero_checkpoint_to_state_dict(checkpoint_dir, output_dir, dtype=torch.float32, max_shard_size="5GB",
                                          safe_serialization=False, tag=None, exclude_frozen_parameters=False):
    """Writes the consolidated weights into output_dir as DeepSpeed 0.19.8 does: pytorch_model.bin (torch.save) or
    model.safetensors, floating-point tensors in `dtype`; with max_shard_size (default "5GB"), split by Hugging
    Face's split_torch_state_dict_into_shards (huggingface_hub) into numbered files plus their index JSON."""
    dtype = _output_dtype(dtype)
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    weights = "model.safetensors" if safe_serialization else "pytorch_model.bin"
    index = None
    if max_shard_size is None:
        files = {weights: list(sd)}
    else:
        try:
            from huggingface_hub import split_torch_state_dict_into_shards
        except ImportError:
            raise ImportError("convert_zero_checkpoint_to_state_dict(max_shard_size=...) splits the weights with "
                              "huggingface_hub: pip install huggingface_hub, or pass max_shard_size=None") from None
        pattern = weights.replace(".bin", "{suffix}.bin").replace(".safetensors", "{suffix}.safetensors")
        split = split_torch_state_dict_into_shards(sd, filename_pattern=pattern, max_shard_size=max_shard_size)
        files = split.filename_to_tensors
        if split.is_sharded:
            index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    os.makedirs(output_dir, exist_ok=True)
    for name, keys in files.items():
        path = os.path.join(output_dir, name)
        if safe_serialization:      # safetensors stores no shared storage: each tensor its own copy
            write_file(path, {k: sd[k].contiguous().clone() for k in keys}, metadata={"format": "pt"})
        else:
            torch.save({k: sd[k] for k in keys}, path)
    if index is not None:
        index_file = "model.safetensors.index.json" if safe_serialization else "pytorch_model.bin.index.json"
        with open(os.path.join(output_dir, index_file), "w", encoding="utf-8") as f:
            f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


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
    return _files(checkpoint_dir, "*_optim_states.pt", "optim_rank*.safetensors")


def get_model_state_files(checkpoint_dir):
    """The model-state files of a tag folder: DeepSpeed's *_model_states.pt (one per rank at stage 3), or dsfast's
    one model file."""
    return _files(checkpoint_dir, "*_model_states.pt", MODEL_FILE)


__all__ = ["get_checkpoint_files", "get_optim_files", "get_model_state_files",
           "get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_state_dict",
           "convert_zero_checkpoint_to_fp32_state_dict", "load_state_dict_from_zero_checkpoint"]
