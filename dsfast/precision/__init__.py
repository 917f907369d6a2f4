"""Mixed precision: loss scalers (dynamic / static for fp16, no-op for bf16 and fp32)."""
from .loss_scaler import (DynamicLossScaler, LossScalerBase, LossScaleUnderflowError, NoOpLossScaler,
                          StaticLossScaler, build_loss_scaler)

__all__ = ["DynamicLossScaler", "StaticLossScaler", "NoOpLossScaler", "LossScalerBase", "LossScaleUnderflowError",
           "build_loss_scaler"]
