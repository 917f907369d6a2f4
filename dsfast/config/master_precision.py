"""Where 16-bit masters and optimizer states are accepted: DeepSpeed 0.19.8's rules, in one place.

    fp16.fp16_master_weights_and_grads   fp16 masters and gradient shards: ZeRO stage 1-3, offload_optimizer, and
                                         (at initialize) DeepSpeedCPUAdam as the optimizer
    bf16.bf16_master_weights_and_grads   bf16 masters and gradient shards: ZeRO stage 1-3; without
                                         bf16_optimizer_states, or with offload_optimizer, DeepSpeedCPUAdam under
                                         offload_optimizer (its fp32 moments cannot stay on the device)
    bf16.bf16_optimizer_states           bf16 moments: ZeRO stage 1-3, needs bf16_master_weights_and_grads; any
                                         optimizer without offload (its states follow the bf16 masters), CPUAdam
                                         with fp32_optimizer_states=False under offload (forced for the config's)

DeepSpeed checks the stage in its config and the offload + optimizer when its ZeRO optimizer is built; here the
config-only rules are checked when the config loads, the optimizer's by zero/precision.check_master_optimizer.
One difference: DeepSpeed would keep bf16 masters of an fp32 or fp16 model (or fp16 masters of a bf16 one);
dsfast asks for the model in the masters' dtype (bf16.enabled / fp16.enabled), which is what the keys are for.
"""


def master_dtype_name(cfg):
    """"bf16" / "fp16" when the config asks for 16-bit masters, else None."""
    if cfg.bf16.bf16_master_weights_and_grads:
        return "bf16"
    if cfg.fp16.fp16_master_weights_and_grads:
        return "fp16"
    return None


def cpu_adam_fp32_states(cfg):
    """fp32_optimizer_states for a DeepSpeedCPUAdam built from the config (DeepSpeed's engine: bf16_optimizer_states
    forces False; else the optimizer section's value, True when unset)."""
    if cfg.bf16.bf16_optimizer_states:
        return False
    given = getattr(getattr(cfg.optimizer, "params", None), "fp32_optimizer_states", None) if cfg.optimizer else None
    return True if given is None else bool(given)


def master_precision_errors(cfg):
    """[(path, message)] for the 16-bit master keys set where DeepSpeed 0.19.8 (or dsfast) refuses them."""
    errors = []
    stage = cfg.zero_stage
    offload = cfg.zero_optimization.offload_optimizer_device != "none"
    for section, key, enabled in (("fp16", "fp16_master_weights_and_grads", cfg.fp16.enabled),
                                  ("bf16", "bf16_master_weights_and_grads", cfg.bf16.enabled),
                                  ("bf16", "bf16_optimizer_states", cfg.bf16.enabled)):
        if not getattr(getattr(cfg, section), key):
            continue
        path = (section, key)
        if stage not in (1, 2, 3):
            errors.append((path, f"true needs ZeRO stage 1, 2 or 3 (stage is {stage}), as in DeepSpeed; set "
                                 "zero_optimization.stage or remove the key"))
        elif not enabled:
            errors.append((path, f'true needs "{section}": {{"enabled": true}}: the masters are kept in the model\'s '
                                 f"{section} dtype"))
    bf16 = cfg.bf16
    if bf16.bf16_optimizer_states and not bf16.bf16_master_weights_and_grads:
        errors.append((("bf16", "bf16_optimizer_states"), "true needs bf16.bf16_master_weights_and_grads=true (the "
                                                          "states follow the masters' dtype), as in DeepSpeed"))
    if cfg.fp16.fp16_master_weights_and_grads and not offload and stage in (1, 2, 3):
        errors.append((("fp16", "fp16_master_weights_and_grads"),
                       "true needs zero_optimization.offload_optimizer.device \"cpu\" (DeepSpeed: fp16 masters with "
                       "ZeRO-Offload and DeepSpeedCPUAdam only)"))
    if bf16.bf16_master_weights_and_grads and not bf16.bf16_optimizer_states and not offload and stage in (1, 2, 3):
        errors.append((("bf16", "bf16_master_weights_and_grads"),
                       "true without bf16_optimizer_states keeps fp32 optimizer states, which DeepSpeed allows only "
                       "on the host: set zero_optimization.offload_optimizer.device to \"cpu\", or set "
                       "bf16.bf16_optimizer_states to true"))
    errors += int8_state_errors(cfg)
    nvme = cfg.zero_optimization.offload_optimizer_device == "nvme"
    for section, key in (("fp16", "fp16_master_weights_and_grads"), ("bf16", "bf16_master_weights_and_grads")):
        if nvme and getattr(getattr(cfg, section), key):
            # the 16-bit masters may be the parameter shards themselves, which must never go to a swap file
            errors.append(((section, key), "true with zero_optimization.offload_optimizer.device \"nvme\" is not "
                                           "supported by dsfast yet: offload the 16-bit masters to \"cpu\", or keep "
                                           "fp32 masters on NVMe"))
    return errors


def states_8bit(cfg):
    """Whether the host optimizer keeps 8-bit block-wise Adam moments (offload_optimizer.state_precision "int8")."""
    off = cfg.zero_optimization.offload_optimizer
    return off is not None and off.state_precision == "int8"


def int8_state_errors(cfg):
    """[(path, message)] where offload_optimizer.state_precision "int8" cannot apply."""
    if not states_8bit(cfg):
        return []
    path = ("zero_optimization", "offload_optimizer", "state_precision")
    stage = cfg.zero_stage
    if stage not in (1, 2, 3) or cfg.zero_optimization.offload_optimizer_device == "none":
        return [(path, f'"int8" keeps 8-bit Adam moments in the host optimizer (dsfast.optim.CPUAdam8bit): it needs '
                       f'ZeRO stage 1, 2 or 3 (stage is {stage}) with offload_optimizer.device "cpu" or "nvme" (it is '
                       f'"{cfg.zero_optimization.offload_optimizer_device}"). For an optimizer on the GPU use '
                       '16-bit states (bf16.bf16_optimizer_states with bf16_master_weights_and_grads), or pass a '
                       "GPU 8-bit optimizer (torchao's AdamW8bit, bitsandbytes' Adam8bit) to "
                       "initialize(optimizer=...)")]
    opt = cfg.optimizer
    torch_adam = bool(getattr(opt.params, "torch_adam", False)) if opt is not None else False
    if opt is not None and (opt.type.lower() not in ("adam", "adamw") or torch_adam):
        return [(path, f'"int8" applies to the Adam/AdamW moments of the dsfast CPU Adam; optimizer.type is '
                       f"{opt.type!r}{' with torch_adam' if torch_adam else ''}: use Adam or AdamW "
                       '(torch_adam false), or state_precision "fp32"')]
    if cfg.bf16.bf16_optimizer_states:
        return [(path, '"int8" and bf16.bf16_optimizer_states ask for two precisions of the same moments: keep one')]
    if cfg.fp16.fp16_master_weights_and_grads:
        return [(path, '"int8" steps fp32 or bf16 masters; fp16.fp16_master_weights_and_grads asks for fp16 ones: '
                       "use bf16 masters or fp32 ones")]
    return []
