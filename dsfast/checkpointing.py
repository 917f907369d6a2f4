"""deepspeed.checkpointing: activation checkpointing as Megatron-style DeepSpeed programs call it.

    deepspeed.checkpointing.configure(mpu, deepspeed_config=..., partition_activations=..., ...)
    out = deepspeed.checkpointing.checkpoint(block, *inputs)
checkpoint() recomputes `function` in backward with torch.utils.checkpoint (reentrant, as DeepSpeed's is; the RNG
state is restored for the recomputation, so dropout matches). DeepSpeed's memory options for the saved inputs
(partition_activations across model-parallel ranks, contiguous_memory_optimization, cpu_checkpointing) are not
acted on: dsfast has no model parallelism, and the inputs stay where they are. Asking for one warns, naming it.
"""
import warnings

import torch
import torch.utils.checkpoint as _torch_checkpoint

_NOT_ACTED_ON = ("partition_activations", "contiguous_checkpointing", "checkpoint_in_cpu")
_configured = False


def configure(mpu_, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None):
    """Accepts DeepSpeed's arguments; warns for each memory option that is asked for and not acted on."""
    global _configured
    section = _config_section(deepspeed_config)
    asked = {"partition_activations": partition_activations if partition_activations is not None
             else section.get("partition_activations"),
             "contiguous_checkpointing": contiguous_checkpointing if contiguous_checkpointing is not None
             else section.get("contiguous_memory_optimization"),
             "checkpoint_in_cpu": checkpoint_in_cpu if checkpoint_in_cpu is not None
             else section.get("cpu_checkpointing")}
    for name in _NOT_ACTED_ON:
        if asked[name]:
            warnings.warn(f"deepspeed.checkpointing.configure: {name}=True is not acted on by dsfast (no model "
                          "parallelism; checkpointed inputs stay on their device); activations are still recomputed")
    if mpu_ is not None:
        warnings.warn("deepspeed.checkpointing.configure: the model-parallel unit (mpu) is not used by dsfast")
    _configured = True


def _config_section(deepspeed_config):
    if deepspeed_config is None:
        return {}
    if isinstance(deepspeed_config, str):
        import json
        with open(deepspeed_config) as f:
            deepspeed_config = json.load(f)
    if not isinstance(deepspeed_config, dict):
        deepspeed_config = getattr(deepspeed_config, "__dict__", {})
    return dict(deepspeed_config.get("activation_checkpointing") or {})


def is_configured():
    return _configured


def reset():
    """DeepSpeed frees its checkpoint buffers here; dsfast keeps none."""


def checkpoint(function, *args):
    """function(*args), its activations recomputed during backward instead of kept."""
    return _torch_checkpoint.checkpoint(function, *args, use_reentrant=True)


def non_reentrant_checkpoint(function, *args):
    return _torch_checkpoint.checkpoint(function, *args, use_reentrant=False)


def detach_variable(inputs, device=None):
    """The tuple `inputs` with each tensor detached (moved to `device` first when given), keeping its requires_grad:
    the leaves a hand-written checkpoint function recomputes from (other items pass through as they are)."""
    if not isinstance(inputs, tuple):
        raise TypeError(f"detach_variable takes a tuple of inputs (as DeepSpeed's does), not {type(inputs).__name__}")
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            wanted = x.requires_grad
            x = (x if device is None else x.to(device)).detach()
            x.requires_grad_(wanted)
        out.append(x)
    return tuple(out)


__all__ = ["configure", "checkpoint", "non_reentrant_checkpoint", "is_configured", "reset", "detach_variable"]
