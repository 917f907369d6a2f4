"""deepspeed.utils.zero_to_fp32: a ZeRO checkpoint (dsfast's or DeepSpeed's) -> one full fp32 state_dict, on CPU,
without a process group (dsfast.checkpoint.consolidate does the work; `dsfast consolidate` is its command)."""
import torch

from ..checkpoint.consolidate import consolidate


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False):
    """{name: fp32 tensor} of the checkpoint in checkpoint_dir (the tag `latest` names when tag is None)."""
    return consolidate(checkpoint_dir, tag, exclude_frozen=exclude_frozen_parameters)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_file, tag=None, exclude_frozen_parameters=False):
    """Writes that state_dict with torch.save (what DeepSpeed's script writes, e.g. pytorch_model.bin)."""
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    torch.save(sd, output_file)
    return sd


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Loads the checkpoint's fp32 weights into `model` (moved to the CPU first, as DeepSpeed does); returns it."""
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(sd, strict=False)
    return model


__all__ = ["get_fp32_state_dict_from_zero_checkpoint", "convert_zero_checkpoint_to_fp32_state_dict",
           "load_state_dict_from_zero_checkpoint"]
