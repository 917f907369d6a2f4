"""The precision policy of a ZeRO owner: in which dtype parameters live, gradients are reduced and accumulated,
and masters are kept. One object, decided once from the config and handed to the storage.

    param_dtype    the model's parameters: fp16 / bf16 in mixed precision, else fp32
    reduce_dtype   gradients as reduced across ranks and accumulated across micro-steps. DeepSpeed's
                   `communication_data_type`; by default the parameters' dtype at ZeRO stages 1-3 (as DeepSpeed) and
                   fp32 at stage 0, whose buckets accumulate 16-bit gradients in fp32 (as DeepSpeed's BF16_Optimizer)
    master_dtype   the optimizer's copy (fp32)

Stages 1-3 take communication_data_type "fp32" for a 16-bit model (more exact reductions, 4 bytes of gradient per
parameter instead of 2) or the model's own dtype; stage 0 reduces in fp32 whatever is asked (a note says so).
"""
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class PrecisionError(ValueError):
    """communication_data_type asks for a reduction this stage cannot do."""


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str                    # fp32 | fp16 | bf16: the training precision
    param_dtype: torch.dtype
    reduce_dtype: torch.dtype
    master_dtype: torch.dtype = torch.float32

    @property
    def dtype(self):
        """The model's 16-bit dtype, None for fp32 (what the engine casts inputs to)."""
        return None if self.param_dtype == torch.float32 else self.param_dtype

    @property
    def mixed(self):
        return self.param_dtype != torch.float32


def precision_policy(name, stage, communication_data_type=None):
    """The policy for training precision `name` (fp32 | fp16 | bf16) at ZeRO `stage`; communication_data_type as
    the config normalises it (fp32 | fp16 | bf16 | None)."""
    if name not in DTYPES:
        raise ValueError(f"unknown precision {name!r}; valid: {', '.join(DTYPES)}")
    param = DTYPES[name]
    if stage == 0:
        return PrecisionPolicy(name, param, torch.float32)
    reduce = DTYPES[communication_data_type] if communication_data_type else param
    if reduce not in (param, torch.float32):
        raise PrecisionError(
            f"communication_data_type={communication_data_type!r} with a {name} model at ZeRO stage {stage}: "
            f"gradients can be reduced in the model's dtype ({name!r}) or in 'fp32'")
    return PrecisionPolicy(name, param, reduce)
