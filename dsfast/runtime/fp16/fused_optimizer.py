"""deepspeed.runtime.fp16.fused_optimizer: FP16_Optimizer, DeepSpeed's wrapper at ZeRO stage 0 with fp16 or bf16
over its FusedAdam (the config's Adam / AdamW). `isinstance(engine.optimizer, FP16_Optimizer)` answers as under
DeepSpeed (dsfast.engine.optimizer_roles)."""
from ...engine import optimizer_roles
from ..base_optimizer import EngineBuiltOptimizer


class FP16_Optimizer(EngineBuiltOptimizer):
    """The stage 0 low-precision optimizer over a fused Adam."""
    _engine_roles = frozenset({optimizer_roles.FP16})


__all__ = ["FP16_Optimizer"]
