"""dsfast.initialize: config -> process group -> device -> state owner -> optimizer -> engine.

Each step is a small function; the state owner is built by dsfast.zero.build.build_owner (the one place a stage
picks it) and used only through dsfast.zero.owner.StateOwner.
"""
import os
import warnings

import torch
import torch.distributed as dist

from ..comm import hang_watch
from ..comm.data_parallel import data_parallel
from ..comm.where import wait_now, waiting
from ..config.master_precision import cpu_adam_fp32_states, states_8bit
from ..precision.keep_fp32 import KeptFp32
from ..zero.planning.auto_offload import resolve_auto_offload
from ..zero.build import build_owner
from ..zero.policy.precision import check_master_optimizer
from .data import build_dataloader
from . import optimizer_roles
from .engine import Engine
from .offload_client_optimizer import check_offload_client_optimizer
from .optimizer_factory import build_optimizer

# Reduction buckets of 1M elements (4 MB fp32): about one transformer block of the benchmark GPT, so each block's
# all-reduce / reduce-scatter overlaps the backward of the blocks below it (benchmarks/engine_step.py
# --bucket_elems). A smaller zero_optimization.reduce_bucket_size in the config wins.
STAGE0_BUCKET_ELEMS = 1 << 20


class MissingModelError(ValueError, AssertionError):
    """initialize() without a model; an AssertionError too, as DeepSpeed 0.19.8 asserts for it."""


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None,
               lr_scheduler=None, config=None, config_params=None, collate_fn=None, dist_init_required=None,
               mpu=None, dist_init_timeout=None, distributed_port=None, mesh_param=None):
    """Build the training engine. Returns (engine, optimizer, training_dataloader, lr_scheduler).

    The config comes from exactly one of `config` (path or dict), `config_params` or `args.deepspeed_config`.
    `optimizer` may be an optimizer object or a callable taking parameters; `lr_scheduler` an object or a
    callable taking the optimizer. Either one overrides the config's section of the same name (with a warning).
    distributed_port: the rendezvous port when this call creates the process group and MASTER_PORT is unset.
    """
    from dsfast.comm import init_distributed
    from dsfast.config import load_config

    if model is None:
        raise MissingModelError("initialize() needs model=<torch.nn.Module>")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if mpu is not None:
        raise NotImplementedError("model parallelism (mpu=...) is not supported by dsfast")
    if mesh_param is not None:
        raise NotImplementedError(f"initialize(mesh_param={mesh_param!r}): device meshes for tensor / sequence "
                                  "parallelism are not supported by dsfast (data parallelism only)")

    if dist_init_required is not False and not dist.is_initialized():
        port = {} if distributed_port is None else {"distributed_port": int(distributed_port)}
        init_distributed(dist_init_required=dist_init_required, timeout=dist_init_timeout, verbose=False, **port)
    if dist.is_initialized():
        from dsfast.comm.teardown import register_exit_teardown
        register_exit_teardown()
    dp = data_parallel()   # handed down as one object: the owner never reaches for the global group itself
    world, rank = dp.world, dp.rank

    cfg = load_config(config=config, config_params=config_params, args=args, world_size=world)
    device = _pick_device(args)
    resolve_auto_offload(cfg, model, world, device)   # "auto" offload: the plan's choice, logged
    model.to(device)
    if dp.group is None:
        hang_watch.start(cfg, model)     # says which rank is where when the ranks stop agreeing (hang_watch.py)
    if world > 1:
        with waiting("initialize"):
            _broadcast_from_rank0(model)

    trainable, groups = _trainable(model, optimizer, model_parameters)
    bucket = min(int(cfg.zero_optimization.reduce_bucket_size), STAGE0_BUCKET_ELEMS)
    previous = getattr(model, "_dsfast_owner", None)
    if previous is not None:  # the model was given to initialize() before: its old hooks must not fire
        previous.detach()
    kept = KeptFp32(model, cfg.data_types.keep_in_fp32_modules, training_dtype(cfg))   # the cast must spare them
    owner = build_owner(cfg, model, trainable, groups, bucket, dp, device)
    kept.restore()
    object.__setattr__(model, "_dsfast_owner", owner)

    opt = _make_optimizer(cfg, optimizer, groups, owner, device, rank)
    if optimizer is not None and opt is not None:
        check_offload_client_optimizer(cfg, opt)
    if opt is not None:
        _check_stage0_grad_accum_dtype(cfg)
    if opt is not None and cfg.zero_stage > 0:
        check_master_optimizer(owner.precision, cfg.zero_optimization.offload_optimizer_device != "none", opt)
    sched = _make_scheduler(cfg, lr_scheduler, opt, rank)
    scaler = _make_loss_scaler(cfg, device)

    loader = None
    if training_data is not None:
        loader = build_dataloader(training_data, cfg.train_micro_batch_size_per_gpu, world, rank,
                                  collate_fn=collate_fn, drop_last=bool(getattr(cfg, "dataloader_drop_last", False)))
    engine = Engine(model, cfg, device, owner, opt, sched, scaler, rank=rank, world_size=world,
                    training_dataloader=loader)
    engine.client_optimizer = optimizer     # DeepSpeed's attribute (optimizer_name() reads it)
    optimizer_roles.record(opt, cfg, client=optimizer)   # isinstance(engine.optimizer, DeepSpeedZeroOptimizer)
    if cfg.disable_python_gc:   # as DeepSpeed 0.19.8: once the engine is built (engine/python_gc.py)
        engine.hold_python_gc()
    if cfg.compile.enabled:     # DeepSpeed <= 0.14.3's compile.enabled / backend / kwargs (config/extras.py)
        engine.compile(backend=cfg.compile.backend, compile_kwargs=cfg.compile.kwargs)
    return engine, opt, loader, sched


def training_dtype(cfg):
    """The dtype the model is cast to (None: it stays as it is, fp32 or under torch_autocast)."""
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)


def _check_stage0_grad_accum_dtype(cfg):
    """DeepSpeed 0.19.8 without ZeRO accumulates gradients in the model's dtype and refuses any other
    data_types.grad_accum_dtype once there is an optimizer (NotImplementedError); so does dsfast."""
    wanted = cfg.data_types.grad_accum_dtype
    if cfg.zero_stage == 0 and wanted is not None and wanted != cfg.precision:
        raise NotImplementedError(
            f"data_types.grad_accum_dtype={wanted!r} with a {cfg.precision} model at ZeRO stage 0: gradients "
            f"accumulate in the model's dtype there (DeepSpeed refuses this mix too); set it to {cfg.precision!r}, "
            "remove it, or use ZeRO stage 1-3")


def _pick_device(args):
    from dsfast.accelerator import get_accelerator   # honours DS_ACCELERATOR=cpu on a GPU machine, as DeepSpeed
    if get_accelerator().device_name() == "cpu":
        return torch.device("cpu")
    local = int(os.environ.get("LOCAL_RANK", getattr(args, "local_rank", 0) if args is not None else 0))
    local = max(local, 0) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


@torch.no_grad()
def _broadcast_from_rank0(model):
    """Every rank starts from rank 0's weights and buffers (as DDP and DeepSpeed do)."""
    for t in list(model.parameters()) + list(model.buffers()):
        if getattr(t, "_dsfast_z3", None) is None:   # zero.Init broadcast partitioned ones as they were built
            wait_now(dist.broadcast(t.data, src=0, async_op=True), ("initialize",))


def _unique(params):
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _trainable(model, optimizer, model_parameters):
    """(trainable params in model order, param groups for the optimizer)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        groups = optimizer.param_groups
        chosen = [p for g in groups for p in g["params"]]
    elif model_parameters is not None:
        groups = list(model_parameters)
        chosen = [p for g in groups for p in g["params"]] if groups and isinstance(groups[0], dict) else groups
    else:
        groups = chosen = [p for p in model.parameters() if p.requires_grad]
    chosen = {id(p) for p in chosen if p.requires_grad}
    in_model = {id(p) for p in model.parameters()}
    stray = [p for p in chosen if p not in in_model]
    if stray:
        raise ValueError(f"{len(stray)} parameter(s) given to the optimizer are not parameters of `model`; "
                         "pass model_parameters=model.parameters() (or a subset of them)")
    ordered = _unique(p for p in model.parameters() if id(p) in chosen)
    return ordered, groups


def _make_optimizer(cfg, client, groups, owner, device, rank):
    opt_cfg = getattr(cfg, "optimizer", None)
    if client is not None:
        if opt_cfg is not None and rank == 0:
            warnings.warn(f"a client optimizer ({type(client).__name__}) was passed to initialize(); the config's "
                          f"'optimizer' section ({opt_cfg.type}) is ignored")
        if isinstance(client, torch.optim.Optimizer):
            owner.adopt_client_optimizer(client, groups)
            return client
        if callable(client):
            return client(owner.optimizer_groups(groups))
        raise TypeError(f"optimizer must be a torch.optim.Optimizer or a callable taking parameters; "
                        f"got {type(client).__name__}")
    if not owner.trains or opt_cfg is None:
        return None  # nothing to train (a frozen model used for eval), or nothing to train it with
    # with offload_optimizer the states live on the host: the CPU kernels step them
    return build_optimizer(opt_cfg, owner.optimizer_groups(groups), owner.optimizer_device or device,
                           fp32_states=cpu_adam_fp32_states(cfg), states_8bit=states_8bit(cfg))


def _make_scheduler(cfg, client, optimizer, rank):
    sched_cfg = getattr(cfg, "scheduler", None)
    if client is not None:
        if sched_cfg is not None and rank == 0:
            warnings.warn(f"a client lr_scheduler was passed to initialize(); the config's 'scheduler' section "
                          f"({sched_cfg.type}) is ignored")
        if callable(client) and not hasattr(client, "step"):
            return client(optimizer)
        return client
    if sched_cfg is None or optimizer is None:
        return None
    from dsfast.schedulers import build_lr_scheduler
    return build_lr_scheduler(sched_cfg, optimizer)


def _make_loss_scaler(cfg, device):
    # fp16, or torch_autocast in float16 (fp32 weights, fp16 activations: the loss is scaled the same way)
    from .autocast import autocast_plan
    if cfg.precision != "fp16" and not autocast_plan(cfg, device).needs_grad_scaler:
        return None
    from dsfast.precision import build_loss_scaler
    return build_loss_scaler(cfg.fp16)
