"""Which DeepSpeed optimizer class an engine's optimizer stands for, so that `isinstance(engine.optimizer,
DeepSpeedZeroOptimizer)` answers as under DeepSpeed 0.19.8, where engine.optimizer is a wrapper chosen by stage and
precision (runtime/engine.py _configure_optimizer). dsfast's engine.optimizer is the torch optimizer itself; the
engine records here what DeepSpeed would have wrapped it in, and the classes of deepspeed.runtime.base_optimizer /
zero.stage_1_and_2 / zero.stage3 consult it in their isinstance checks."""
import weakref

ZERO_1_2 = "DeepSpeedZeroOptimizer"          # ZeRO stages 1 and 2
ZERO_3 = "DeepSpeedZeroOptimizer_Stage3"     # ZeRO stage 3
BF16 = "BF16_Optimizer"                      # stage 1, bf16 model, fp32 gradient accumulation, no offload
FP16 = "FP16_Optimizer"                      # stage 0 fp16 or bf16 (fp32 masters) over a fused Adam
FP16_UNFUSED = "FP16_UnfusedOptimizer"       # the same over any other optimizer (LAMB, SGD, torch's Adam, ...)

_roles = weakref.WeakKeyDictionary()          # optimizer -> one of the above


def deepspeed_role(config, optimizer=None, client=None):
    """The class DeepSpeed wraps the optimizer in for this config (None: it uses the optimizer as is); `client`:
    what the program passed to initialize() as its optimizer (None: the config's section built it)."""
    stage, precision = config.zero_stage, config.precision
    if stage == 3:
        return ZERO_3
    if stage in (1, 2):
        if (stage == 1 and precision == "bf16" and config.data_types.grad_accum_dtype == "fp32"
                and config.zero_optimization.offload_optimizer_device == "none"):
            return BF16
        return ZERO_1_2
    if precision not in ("fp16", "bf16"):
        return None
    return FP16 if _fused_adam(config, optimizer, client) else FP16_UNFUSED


def _fused_adam(config, optimizer, client):
    """Whether DeepSpeed's engine would hold its FusedAdam here (it picks FP16_Optimizer for that, the unfused
    wrapper for anything else): a FusedAdam passed in, or the config's Adam / AdamW without torch_adam, which
    DeepSpeed builds as FusedAdam (dsfast too on a GPU; CPU ranks answer as the same config would there)."""
    from ..optim.fused_adam import FusedAdam
    if isinstance(optimizer, FusedAdam):
        return True
    if client is not None:       # the program's own optimizer: the config's section was not used
        return False
    opt = getattr(config, "optimizer", None)
    if opt is None or getattr(opt, "type", "").lower() not in ("adam", "adamw"):
        return False
    return not bool(getattr(getattr(opt, "params", None), "torch_adam", False))


def record(optimizer, config, client=None):
    if optimizer is None:
        return
    role = deepspeed_role(config, optimizer, client)
    if role is None:
        _roles.pop(optimizer, None)
    else:
        _roles[optimizer] = role


def role_of(obj):
    try:
        return _roles.get(obj)
    except TypeError:            # not weak-referenceable or unhashable: never an engine's optimizer
        return None
