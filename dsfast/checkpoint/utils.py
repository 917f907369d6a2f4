"""deepspeed.checkpoint.utils: clone_tensors_for_torch_save (what Hugging Face's accelerate calls on a state dict) and
get_model_ckpt_name_for_rank (DeepSpeed's model-state file name)."""
import os

import torch

from .constants import MODEL_FILE_PREFIX, MODEL_FILE_SUFFIX


def clone_tensors_for_torch_save(item, device=torch.device("cpu")):
    """A copy of `item` (nested dicts, lists, tuples of tensors) with every tensor cloned onto `device`, so that
    torch.save writes each tensor's own values and not the whole storage a view shares with others."""
    if torch.is_tensor(item):
        return item.detach().to(device, copy=True)
    if isinstance(item, dict):
        return type(item)((k, clone_tensors_for_torch_save(v, device)) for k, v in item.items())
    if isinstance(item, (list, tuple)):
        return type(item)(clone_tensors_for_torch_save(v, device) for v in item)
    return item


def get_model_ckpt_name_for_rank(base_folder, mp_rank_str):
    """DeepSpeed's name of a model-parallel rank's model-state file in a tag folder: `mp_rank_<mp_rank_str>_model_
    states.pt`. dsfast's own checkpoints keep the module in other files (README, Checkpoints); this names the file
    a DeepSpeed checkpoint has, which `dsfast convert-deepspeed` and the DeepSpeed-checkpoint import read."""
    return os.path.join(base_folder, f"{MODEL_FILE_PREFIX}{mp_rank_str}{MODEL_FILE_SUFFIX}")
