"""engine.save_16bit_model: the whole model's weights in the model dtype in one file.

Under ZeRO stage 3 the weights are gathered from the partitions (zero.save16.gathered_state_dict, a collective:
every rank calls it); rank 0 writes the file: `*.safetensors` in the safetensors format, anything else with
torch.save, as DeepSpeed does.
"""
import os

import torch
import torch.distributed as dist

from ..comm.where import wait_now
from ..zero.params.save16 import gathered_state_dict
from .safetensors_io import write_file


def save_16bit_model(module, save_dir, save_filename, exclude_frozen=False):
    sd = gathered_state_dict(module, exclude_frozen=exclude_frozen)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        path = os.path.join(save_dir, save_filename)
        if save_filename.endswith(".safetensors"):
            write_file(path, sd)
        else:
            torch.save(sd, path)
    if dist.is_initialized():
        wait_now(dist.barrier(async_op=True), ("save_16bit_model",))
    return True
