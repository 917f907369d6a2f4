"""deepspeed.init_inference: a model ready for inference on this rank's device, in the requested dtype.

    model = dsfast.init_inference(model, dtype=torch.half)           # or config={"dtype": "fp16", ...}
    out = model(inputs); text = model.generate(ids)                   # the module's own forward / generate

dsfast runs the model's own modules: no kernel injection, no tensor parallelism (each rank holds the whole model),
no quantized inference. What asks for those is a clear error (tensor parallelism over several ranks, int8, a
checkpoint to shard) or, where the outputs are the same either way (kernel injection, CUDA graphs, Triton), a
warning that names the key. Unknown keys are errors, as in the training config.
"""
import json
import warnings

import torch

from .config.errors import suggest

_DTYPES = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
           "int8": torch.int8}
# settings of DeepSpeed's injected kernels (the outputs are the same without them): a warning when not the default
_SPEED_ONLY = {"replace_with_kernel_inject": False, "kernel_inject": False, "enable_cuda_graph": False,
               "use_triton": False, "triton_autotune": False, "injection_policy": None, "injection_dict": None,
               "injection_policy_tuple": None, "replace_method": "auto", "triangular_masking": True, "tm": True,
               "max_out_tokens": 1024, "max_tokens": 1024, "min_out_tokens": 1, "min_tokens": 1,
               "transposed_mode": False, "return_tuple": True, "keep_module_on_host": False,
               "set_empty_params": False}
_OTHER_KEYS = {"dtype", "tensor_parallel", "tp", "mp_size", "training_mp_size", "mpu", "checkpoint", "base_dir",
               "save_mp_checkpoint_path", "checkpoint_config", "ckpt_config", "quant", "moe", "ep_size", "ep_group",
               "ep_mp_group", "moe_experts", "moe_type", "zero", "config", "args"}


def _tp_size(cfg):
    tp = cfg.get("tensor_parallel", cfg.get("tp")) or {}
    if not isinstance(tp, dict):
        raise ValueError(f"init_inference: tensor_parallel must be a dict such as {{\"tp_size\": 1}}, got {tp!r}")
    return max(int(tp.get("tp_size", 1)), int(cfg.get("mp_size", 1)))


def _dtype(value):
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.lower().replace("torch.", "") in _DTYPES:
        return _DTYPES[value.lower().replace("torch.", "")]
    raise ValueError(f"init_inference: dtype={value!r}; valid: a torch dtype or one of {', '.join(_DTYPES)}")


def resolve(config=None, **kwargs):
    """The merged settings (config dict or JSON path, then kwargs; a key given both ways must agree)."""
    if config is None:
        config = {}
    elif isinstance(config, str):
        with open(config) as f:
            config = json.load(f)
    elif not isinstance(config, dict):
        raise ValueError(f"init_inference: config must be a dict or a JSON file path, got {type(config).__name__}")
    for key in set(config) & set(kwargs):
        if config[key] != kwargs[key]:
            raise ValueError(f"init_inference: {key!r} is {config[key]!r} in config but {kwargs[key]!r} as an "
                             f"argument")
    cfg = {**config, **kwargs}
    for key in cfg:
        if key not in _SPEED_ONLY and key not in _OTHER_KEYS:
            raise ValueError(f"init_inference: unknown setting {key!r}; "
                             f"{suggest(key, list(_SPEED_ONLY) + sorted(_OTHER_KEYS))}")
    return cfg


class InferenceEngine(torch.nn.Module):
    def __init__(self, model, cfg):
        super().__init__()
        from .accelerator import get_accelerator
        import torch.distributed as dist
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if _tp_size(cfg) > 1:
            raise NotImplementedError(f"init_inference: tensor parallelism (tp_size / mp_size {_tp_size(cfg)}) is "
                                      "not supported by dsfast; each rank runs the whole model (tp_size 1)")
        if cfg.get("checkpoint") is not None or cfg.get("save_mp_checkpoint_path"):
            raise NotImplementedError("init_inference(checkpoint=... / save_mp_checkpoint_path=...): loading or "
                                      "writing sharded inference checkpoints is not supported; load the weights "
                                      "into the model (load_state_dict) before init_inference")
        if cfg.get("quant") and (not isinstance(cfg["quant"], dict) or cfg["quant"].get("enabled", True)):
            raise NotImplementedError("init_inference: quantized inference (quant) is not supported")
        dtype = _dtype(cfg.get("dtype", torch.float16))
        if dtype == torch.int8:
            raise NotImplementedError("init_inference(dtype=int8): quantized inference is not supported; use "
                                      "fp16, bf16 or fp32")
        for key, default in _SPEED_ONLY.items():
            if key in cfg and cfg[key] != default:
                warnings.warn(f"init_inference: {key}={cfg[key]!r} has no effect in dsfast (it runs the model's "
                              f"own modules, the outputs are theirs)", stacklevel=3)
        self.dtype = dtype
        self.world_size = world
        self._config = cfg
        device = torch.device(get_accelerator().current_device_name())
        self.module = model.to(device=device, dtype=dtype) if dtype.is_floating_point else model.to(device)
        self.module.eval()
        self.device = device
        if hasattr(self.module, "generate"):
            self.generate = self._generate

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def _generate(self, *inputs, **kwargs):
        return self.module.generate(*inputs, **kwargs)


def default_inference_config():
    """The settings init_inference starts from (DeepSpeed's defaults of the keys dsfast reads)."""
    return {"dtype": torch.float16, "tensor_parallel": {"tp_size": 1}, **_SPEED_ONLY}


def init_inference(model, config=None, **kwargs):
    """DeepSpeed's init_inference(model, config=None, **kwargs) -> an InferenceEngine around `model`."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"init_inference(model): a torch.nn.Module is needed, got {type(model).__name__}")
    return InferenceEngine(model, resolve(config, **kwargs))
