"""Which DeepSpeed optimizer class an engine's optimizer stands for, so that `isinstance(engine.optimizer,
DeepSpeedZeroOptimizer)` answers as under DeepSpeed 0.19.8, where engine.optimizer is a wrapper chosen by stage and
precision (runtime/engine.py _configure_optimizer). dsfast's engine.optimizer is the torch optimizer itself; the
engine records here what DeepSpeed would have wrapped it in, and the classes of deepspeed.runtime.base_optimizer /
zero.stage_1_and_2 / zero.stage3 consult it in their isinstance checks."""
import weakref

ZERO_1_2 = "DeepSpeedZeroOptimizer"          # ZeRO stages 1 and 2
ZERO_3 = "DeepSpeedZeroOptimizer_Stage3"     # ZeRO stage 3
BF16 = "BF16_Optimizer"                      # stage 1, bf16 model, fp32 gradient accumulation, no offload
FP16 = "FP16_Optimizer"                      # stage 0 fp16 or bf16 (fp32 masters)

_roles = weakref.WeakKeyDictionary()          # optimizer -> one of the above


def deepspeed_role(config):
    """The class DeepSpeed wraps the optimizer in for this config (None: it uses the optimizer as is)."""
    stage, precision = config.zero_stage, config.precision
    if stage == 3:
        return ZERO_3
    if stage in (1, 2):
        if (stage == 1 and precision == "bf16" and config.data_types.grad_accum_dtype == "fp32"
                and config.zero_optimization.offload_optimizer_device == "none"):
            return BF16
        return ZERO_1_2
    return FP16 if precision in ("fp16", "bf16") else None


def record(optimizer, config):
    if optimizer is None:
        return
    role = deepspeed_role(config)
    if role is None:
        _roles.pop(optimizer, None)
    else:
        _roles[optimizer] = role


def role_of(obj):
    try:
        return _roles.get(obj)
    except TypeError:            # not weak-referenceable or unhashable: never an engine's optimizer
        return None
