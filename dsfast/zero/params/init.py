"""dsfast.zero.Init: build a model with its parameters partitioned module by module (DeepSpeed's zero.Init).

    with dsfast.zero.Init(config_dict_or_path=ds_config):
        model = GPT(cfg)           # no rank ever holds the whole model
    engine, *_ = dsfast.initialize(model=model, config=ds_config, ...)

Every nn.Module subclass's __init__ is wrapped while the context is open: when a module's construction finishes,
each of its own parameters is broadcast from rank 0 (so every rank starts from the same values, as initialize()
does for ordinary models) and partitioned (partitioned_param.py); only the module being built is ever whole.

Parents that touch their children's parameters while being built (`self.apply(self._init_weights)`, a loop over
`self.named_parameters()`, tying `self.head.weight = self.emb.weight`) find them released; the lookup (module
`_parameters`, see param_hooks.ZeroParamDict) gathers them for the change, and they are partitioned again, rank 0's
values kept, as soon as the parameters of another module are touched or a module's __init__ ends. One module's
parameters are whole at a time: code that keeps a parameter of one module while changing another module's must use
dsfast.zero.GatheredParameters(..., modifier_rank=0) instead.
"""
import json
import os

import torch
import torch.distributed as dist

from ...comm.env import discover
from ...comm.where import wait_now
from ...precision.keep_fp32 import upcast_kept
from . import hooks as param_hooks
from .hooks import ZeroParamDict
from .ds_methods import attach as attach_ds_methods
from .partitioned_param import PartitionedParam, gather, record_of


class _Window:
    """The released parameters gathered for a change during construction (one module's dict at a time)."""

    def __init__(self):
        self.owner = None
        self.records = []
        self.building = 0   # module __init__s running (outside them a lookup changes nothing)

    def touch(self, params_dict, params):
        if not self.building:
            return
        if params_dict is not self.owner:
            self.flush()
            self.owner = params_dict
        recs = [r for r in (record_of(p) for p in params) if r is not None and not r.gathered]
        if recs:
            for r in recs:
                r.refs += 1
            gather(recs)
            self.records += recs

    @torch.no_grad()
    def flush(self):
        for r in self.records:
            values = r.param.data
            if r.world > 1:
                wait_now(dist.broadcast(values, src=0, group=r.group, async_op=True), ("zero.Init", [r]))
            r.set_from_full(values)
            r.refs -= 1
            r.release()
        self.records = []
        self.owner = None


def _all_module_classes():
    out, todo = set(), [torch.nn.Module]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


class Init:
    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True, remote_device=None,
                 pin_memory=False, config_dict_or_path=None, config=None, enabled=True, dtype=None, mpu=None):
        if mpu is not None:
            raise NotImplementedError("zero.Init(mpu=...): model parallelism is not supported by dsfast")
        if remote_device not in (None, "none", "cpu", "cuda", "device", "nvme"):
            raise ValueError(f"zero.Init(remote_device={remote_device!r}): valid are None (the device), \"cpu\" "
                             "and \"nvme\" (host memory)")
        self.enabled = enabled
        self.group = data_parallel_group
        self.dtype = dtype
        cfg = _read_config(config_dict_or_path if config_dict_or_path is not None else config)
        param_cfg = (cfg.get("zero_optimization") or {}).get("offload_param") or {}
        # NVMe: the partitions are built in host memory; initialize() moves them to their swap files
        self.offload = remote_device in ("cpu", "nvme") or \
            str(param_cfg.get("device", "none")).lower() in ("cpu", "nvme")
        # as DeepSpeed 0.19.8: an offload_param section's pin_memory (default true) replaces the argument
        self.pin = bool(param_cfg.get("pin_memory", True)) if param_cfg else bool(pin_memory)
        # offload_param on NVMe with a path: each partition goes to its swap file as soon as it is made
        self.nvme = _nvme_target(param_cfg, cfg.get("aio"), self.pin)
        self.swap = None
        # data_types.keep_in_fp32_modules: buffers the model names stay fp32 (precision/keep_fp32.py)
        self.keep_fp32 = _keep_fp32_setting(cfg)
        self.train_dtype = dtype or _config_dtype(cfg)
        self._patched = {}
        self._window = _Window()
        if module is not None and enabled:   # an existing module: partition it now
            self._setup()
            for m in module.modules():
                self._partition(m)
            upcast_kept(module, self.keep_fp32, self.train_dtype)

    # ---- where partitions live ----------------------------------------------------------------------------
    def _setup(self):
        # as DeepSpeed's Init: join the process group a launcher describes (torchrun / MPI / Slurm variables), a
        # world of one included; without launcher variables there is no group to join (a world of one process)
        if not dist.is_initialized() and discover(os.environ).source != "single":
            from dsfast.comm import init_distributed
            init_distributed(verbose=False)
        self.world = dist.get_world_size(self.group) if dist.is_initialized() else 1
        self.rank = dist.get_rank(self.group) if dist.is_initialized() else 0
        if torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.shard_device = torch.device("cpu") if self.offload else self.device

    @torch.no_grad()
    def _partition(self, module):
        for name, p in list(dict.items(module._parameters)):
            if p is None or record_of(p) is not None:
                continue
            p.data = p.data.to(self.device, dtype=self.dtype or p.dtype)
            if self.world > 1:
                wait_now(dist.broadcast(p.data, src=0, group=self.group, async_op=True), ("zero.Init", [p]))
            rec = PartitionedParam(p, self.world, self.rank, self.group, self.device, self.shard_device,
                                   pin=self.pin and self.nvme is None)
            attach_ds_methods(p)   # DeepSpeed's param.all_gather / partition / all_gather_coalesced
            if self.nvme is not None:
                if self.swap is None:
                    from ..nvme.params import construction_swap
                    self.swap = construction_swap(self.nvme, self.rank)
                self.swap.add(rec)
        if not isinstance(module._parameters, ZeroParamDict):
            module._parameters = ZeroParamDict(module._parameters)

    # ---- the context --------------------------------------------------------------------------------------
    def _wrap(self, cls):
        if "__init__" not in cls.__dict__ or cls in self._patched:
            return
        orig = cls.__dict__["__init__"]
        ctx = self

        def __init__(module, *args, **kwargs):
            depth = module.__dict__.get("_dsfast_init_depth", 0)
            module.__dict__["_dsfast_init_depth"] = depth + 1
            ctx._window.building += 1
            try:
                orig(module, *args, **kwargs)
            finally:
                module.__dict__["_dsfast_init_depth"] = depth
                ctx._window.building -= 1
            if depth == 0:   # the most derived __init__ is done: the module is built
                ctx._window.flush()
                ctx._partition(module)
                # its fp32 list is complete now, before any checkpoint is loaded into the buffers it names
                upcast_kept(module, ctx.keep_fp32, ctx.train_dtype)
                del module.__dict__["_dsfast_init_depth"]

        __init__.__wrapped__ = orig
        self._patched[cls] = orig
        cls.__init__ = __init__

    def __enter__(self):
        if not self.enabled:
            return self
        self._setup()
        for cls in _all_module_classes():
            self._wrap(cls)
        ctx = self
        self._old_subclass_hook = torch.nn.Module.__dict__.get("__init_subclass__")

        def __init_subclass__(cls, **kwargs):
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            ctx._wrap(cls)

        torch.nn.Module.__init_subclass__ = classmethod(__init_subclass__)
        param_hooks.CONSTRUCTION.append(self._window)
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        self._window.flush()
        param_hooks.CONSTRUCTION.remove(self._window)
        for cls, orig in self._patched.items():
            cls.__init__ = orig
        self._patched.clear()
        if self._old_subclass_hook is None:
            del torch.nn.Module.__init_subclass__
        else:
            torch.nn.Module.__init_subclass__ = self._old_subclass_hook
        return False


def _nvme_target(param_cfg, aio, pin):
    """The placement.NvmeTarget of a config's offload_param section when it asks for NVMe with a path, else
    None (remote_device="nvme" alone names no directory: the partitions stay in host memory). Its max_in_cpu is
    initialize()'s to apply (nvme_params.train), from the config it is given."""
    if str(param_cfg.get("device", "none")).lower() != "nvme" or not param_cfg.get("nvme_path"):
        return None
    from ..policy.placement import NvmeTarget, aio_pool
    return NvmeTarget(param_cfg["nvme_path"], int(param_cfg.get("buffer_count", 5)),
                      pin=bool(pin) and torch.cuda.is_available(), **aio_pool(aio if isinstance(aio, dict) else None))


def _config_dtype(cfg):
    """The 16-bit dtype the config trains in (None: fp32)."""
    bf16 = cfg.get("bf16", cfg.get("bfloat16")) or {}
    if isinstance(bf16, dict) and bf16.get("enabled"):
        return torch.bfloat16
    fp16 = cfg.get("fp16") or {}
    return torch.float16 if isinstance(fp16, dict) and fp16.get("enabled") else None


def _keep_fp32_setting(cfg):
    """data_types.keep_in_fp32_modules, checked as the config loader checks it (a DsConfigError naming it)."""
    from pydantic import ValidationError

    from dsfast.config.errors import raise_problems
    from dsfast.config.extras import DataTypesConfig
    value = (cfg.get("data_types") or {}).get("keep_in_fp32_modules", "auto")
    try:
        return DataTypesConfig(keep_in_fp32_modules=value).keep_in_fp32_modules
    except ValidationError as err:
        raise_problems([("data_types.keep_in_fp32_modules", err.errors()[0]["msg"])])


def _read_config(cfg):
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return cfg
    if isinstance(cfg, (str, os.PathLike)):
        with open(cfg) as f:
            return json.load(f)
    return getattr(cfg, "__dict__", {})
