"""deepspeed.runtime.bf16_optimizer: BF16_Optimizer, the class DeepSpeed wraps the optimizer in at ZeRO stage 1 with a
bf16 model, fp32 gradient accumulation and no offload. Programs import it for `isinstance(engine.optimizer,
BF16_Optimizer)` (Megatron-DeepSpeed's checkpoint code, accelerate patches); an engine's optimizer answers True
where DeepSpeed's would be one (dsfast.engine.optimizer_roles)."""
from ..engine import optimizer_roles
from .base_optimizer import EngineBuiltOptimizer


class BF16_Optimizer(EngineBuiltOptimizer):
    """The bf16 stage 1 optimizer: isinstance() is true of engine.optimizer in that configuration."""
    _engine_roles = frozenset({optimizer_roles.BF16})


__all__ = ["BF16_Optimizer"]
