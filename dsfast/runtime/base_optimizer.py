"""deepspeed.runtime.base_optimizer: DeepSpeedOptimizer and ZeROOptimizer, the bases of DeepSpeed's optimizer
wrappers. Programs test `isinstance(engine.optimizer, ...)` against them; dsfast's engine optimizer is the torch
optimizer itself, so these checks also answer True for an engine's optimizer at the stage and precision where
DeepSpeed's engine.optimizer would be such a wrapper (dsfast.engine.optimizer_roles)."""
from ..engine import optimizer_roles


class _EngineRoleCheck(type):
    def __instancecheck__(cls, obj):
        return type.__instancecheck__(cls, obj) or optimizer_roles.role_of(obj) in cls._engine_roles


class DeepSpeedOptimizer(metaclass=_EngineRoleCheck):
    """Base of every optimizer wrapper (DeepSpeed's is an empty class; programs subclass it too)."""
    _engine_roles = frozenset({optimizer_roles.ZERO_1_2, optimizer_roles.ZERO_3, optimizer_roles.BF16,
                               optimizer_roles.FP16, optimizer_roles.FP16_UNFUSED})


class ZeROOptimizer(DeepSpeedOptimizer):
    """Base of the ZeRO wrappers (stages 1-3 and the bf16 stage 1 optimizer)."""
    _engine_roles = frozenset({optimizer_roles.ZERO_1_2, optimizer_roles.ZERO_3, optimizer_roles.BF16})


class EngineBuiltOptimizer(ZeROOptimizer):
    """A wrapper only initialize() makes; constructing one by hand is refused with what to do instead."""
    _engine_roles = frozenset()

    def __init__(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} is built by deepspeed.initialize() from the config's "
                        f"zero_optimization stage; dsfast does not build it by hand. Pass the torch optimizer (or "
                        f"the config's 'optimizer' section) to initialize(); engine.optimizer then answers "
                        f"isinstance(..., {type(self).__name__}) at that stage")


__all__ = ["DeepSpeedOptimizer", "ZeROOptimizer"]
