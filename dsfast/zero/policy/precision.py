"""The precision policy of a ZeRO owner: in which dtype parameters live, gradients are reduced and accumulated,
and masters are kept. One object, decided once from the config and handed to the storage.

    param_dtype    the model's parameters: fp16 / bf16 in mixed precision, else fp32
    reduce_dtype   gradients as reduced across ranks and accumulated across micro-steps. DeepSpeed's
                   `communication_data_type`; by default the parameters' dtype at ZeRO stages 1-3 (as DeepSpeed) and
                   fp32 at stage 0, whose buckets accumulate 16-bit gradients in fp32 (as DeepSpeed's BF16_Optimizer)
    master_dtype   the optimizer's copy: fp32, or the model's own 16-bit dtype (bf16_master_weights_and_grads,
                   fp16_master_weights_and_grads: ZeRO stages 1-3). Masters in the parameters' dtype are handled as an
                   fp32 model's are: the shard of the parameter bucket itself where the placement allows (one copy),
                   else a copy that is written back after the step; the optimizer steps them in place and its
                   states follow its fp32_optimizer_states (config/master_precision.py says where each is accepted)

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
    states_16bit: bool = False   # bf16_optimizer_states: the moments in the masters' 16-bit dtype

    @property
    def dtype(self):
        """The model's 16-bit dtype, None for fp32 (what the engine casts inputs to)."""
        return None if self.param_dtype == torch.float32 else self.param_dtype

    @property
    def mixed(self):
        return self.param_dtype != torch.float32


def precision_policy(name, stage, communication_data_type=None, master=None, states_16bit=False):
    """The policy for training precision `name` (fp32 | fp16 | bf16) at ZeRO `stage`; communication_data_type as
    the config normalises it (fp32 | fp16 | bf16 | None); master: "bf16" / "fp16" for 16-bit masters (the config
    allows them at stages 1-3 with the model in that dtype), None for fp32 ones; states_16bit: bf16_optimizer_states."""
    if name not in DTYPES:
        raise ValueError(f"unknown precision {name!r}; valid: {', '.join(DTYPES)}")
    param = DTYPES[name]
    if master is not None and (stage == 0 or master != name):
        raise PrecisionError(f"{master} master weights need ZeRO stage 1-3 and a {master} model (stage {stage}, "
                             f"{name} model)")
    master_dtype = DTYPES[master] if master else torch.float32
    if stage == 0:
        return PrecisionPolicy(name, param, torch.float32)
    reduce = DTYPES[communication_data_type] if communication_data_type else param
    if reduce not in (param, torch.float32):
        raise PrecisionError(
            f"communication_data_type={communication_data_type!r} with a {name} model at ZeRO stage {stage}: "
            f"gradients can be reduced in the model's dtype ({name!r}) or in 'fp32'")
    return PrecisionPolicy(name, param, reduce, master_dtype, bool(states_16bit))


def check_master_optimizer(policy, offload, optimizer):
    """DeepSpeed 0.19.8's rule for 16-bit masters, checked once the optimizer exists: fp16 masters, and bf16
    masters whose moments are fp32 or on the host, need offload_optimizer and DeepSpeedCPUAdam (that very class);
    bf16 moments on the host need it built with fp32_optimizer_states=False. bf16 masters with bf16 moments on the
    device take any optimizer: its states follow the masters' dtype."""
    if policy.master_dtype == torch.float32:
        return
    from ...optim.cpu_adam import CPUAdam
    from ...optim.cpu_adam8bit import CPUAdam8bit
    bf16_states = policy.master_dtype == torch.bfloat16 and policy.states_16bit
    if bf16_states and not offload:
        return
    if offload and type(optimizer) is CPUAdam8bit and policy.master_dtype == torch.bfloat16 and not bf16_states:
        return   # bf16 masters with 8-bit moments on the host (offload_optimizer.state_precision "int8")
    name = "fp16_master_weights_and_grads" if policy.master_dtype == torch.float16 else \
        "bf16_master_weights_and_grads"
    if not offload or type(optimizer) is not CPUAdam:
        raise PrecisionError(f"{name}=true needs ZeRO-Offload (offload_optimizer) with DeepSpeedCPUAdam "
                             f"(dsfast.optim.CPUAdam) as the optimizer, as in DeepSpeed; the optimizer is "
                             f"{type(optimizer).__name__}, offload_optimizer is {'on' if offload else 'off'}")
    if bf16_states and optimizer.fp32_optimizer_states:
        raise PrecisionError("bf16_optimizer_states=true with offload_optimizer needs the CPUAdam built with "
                             "fp32_optimizer_states=False, so its moments are stored in bf16 (the config's optimizer "
                             "is built so; pass fp32_optimizer_states=False to your own)")
