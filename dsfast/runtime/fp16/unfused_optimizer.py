"""deepspeed.runtime.fp16.unfused_optimizer: FP16_UnfusedOptimizer, DeepSpeed's wrapper at ZeRO stage 0 with fp16 or
bf16 over any optimizer but its FusedAdam (LAMB, SGD, torch's Adam, a program's own). `isinstance(engine.optimizer,
FP16_UnfusedOptimizer)` answers as under DeepSpeed (dsfast.engine.optimizer_roles)."""
from ...engine import optimizer_roles
from ..base_optimizer import EngineBuiltOptimizer


class FP16_UnfusedOptimizer(EngineBuiltOptimizer):
    """The stage 0 low-precision optimizer over any other optimizer."""
    _engine_roles = frozenset({optimizer_roles.FP16_UNFUSED})


__all__ = ["FP16_UnfusedOptimizer"]
