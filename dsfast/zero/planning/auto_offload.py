"""`"offload_optimizer": {"device": "auto"}`: initialize() picks none, cpu or nvme from the offload plan
(dsfast.zero.planning.plan) for this model, this world size and this machine's memory, keeping everything else the
config
says (stage, offload_param, masters' and states' precision), and logs the choice with its bytes.

Of the placements that fit, the fastest is taken: the accelerator's memory, then the host's, then the disk (only
where the section gives an nvme_path). Every rank decides from its own host and the job takes the slowest choice,
so all ranks agree and the choice fits on every host.
"""
import logging

from .plan import PLACES, make_plan

logger = logging.getLogger("dsfast.zero")

ORDER = ("none", "cpu", "nvme")   # fastest first


def _matches(cfg):
    """The plan rows the config leaves open: its stage, offload_param and precision (8-bit moments,
    state_precision "int8": the plan's int8 rows, which are host optimizers only, so "cpu" or "nvme")."""
    z = cfg.zero_optimization
    param = {"none": False, "cpu": True, "nvme": "nvme"}[z.offload_param_device]
    masters = "bf16" if cfg.bf16.bf16_master_weights_and_grads else "fp32"
    states = "int8" if z.offload_optimizer.state_precision == "int8" else \
        "bf16" if cfg.bf16.bf16_optimizer_states else "fp32"
    return lambda r: (r["stage"] == z.stage and r["offload_param"] == param and r["masters"] == masters
                      and r["states"] == states)


def choose(cfg, params, largest, world, local_ranks, fig):
    """(device, plan row) for an "auto" offload_optimizer; ValueError where nothing fits or auto cannot apply."""
    if cfg.fp16.fp16_master_weights_and_grads:
        raise ValueError('zero_optimization.offload_optimizer.device "auto" does not plan fp16 masters '
                         '(fp16_master_weights_and_grads, which needs "cpu"): set the device to "cpu"')
    mixed = cfg.fp16.enabled or cfg.bf16.enabled
    z = cfg.zero_optimization
    config_rows = _matches(cfg)
    may_swap = bool(z.offload_optimizer.nvme_path)   # "nvme" needs the section's own nvme_path

    def only(r):
        return config_rows(r) and (r["offload_optimizer"] != "nvme" or may_swap)
    rows = make_plan(params, world, fig, local_ranks, mixed, largest, headroom=0.9, only=only,
                     buffer_count=max(z.offload_optimizer.buffer_count, 1), bucket=z.reduce_bucket_size)
    if not rows:
        raise ValueError(f'zero_optimization.offload_optimizer.device "auto" has no placement to choose from with '
                         f'offload_param "{z.offload_param_device}"; give offload_optimizer an "nvme_path" or set '
                         "its device yourself")
    fitting = [r for r in rows if not r["why_not"]]
    if not fitting:
        why = "; ".join(f"{PLACES[r['offload_optimizer']]}: {', '.join(r['why_not'])}" for r in rows)
        hint = "" if fig.nvme_path else ' (give "nvme_path" in the section to let it consider NVMe)'
        raise ValueError(f'zero_optimization.offload_optimizer.device "auto": no placement of the optimizer '
                         f"states of {params} parameters fits on this machine at stage {cfg.zero_stage} with "
                         f"{world} rank(s) ({why}){hint}; add ranks or memory, or set the device yourself")
    best = min(fitting, key=lambda r: ORDER.index(PLACES[r["offload_optimizer"]]))
    return PLACES[best["offload_optimizer"]], best


def measured_figures(device, nvme_path):
    """This host's figures for the choice (no bandwidth: the order above does not depend on it)."""
    import torch

    from .host_figures import measure_host
    given = {}
    if device.type == "cuda":
        given["device_memory"] = torch.cuda.mem_get_info(device)[1]
    fig = measure_host(nvme_path, bandwidth=False, **given)
    if device.type != "cuda":
        fig.device_memory = None   # the CPU trains: the "device" bytes are host memory
    return fig


def resolve_auto_offload(cfg, model, world, device, figures=None):
    """Replace device "auto" in cfg's offload_optimizer by the plan's choice (in place); returns it, or None where
    the config does not say "auto". figures: HostFigures to use instead of measuring (tests)."""
    off = cfg.zero_optimization.offload_optimizer
    if off is None or off.device != "auto":
        return None
    from .estimate import model_sizes
    from ..owners.sharded import local_ranks
    params, largest = model_sizes(model)
    z = cfg.zero_optimization
    disk = off.nvme_path or (z.offload_param.nvme_path if z.offload_param_device == "nvme" else None)
    fig = measured_figures(device, disk) if figures is None else figures
    choice, row = choose(cfg, params, largest, world, min(local_ranks(), world), fig)
    choice = _slowest_over_ranks(choice)
    off.device = choice
    _check_state_precision(cfg)
    gib = float(1 << 30)
    logger.warning(f'offload_optimizer.device "auto" -> "{choice}" (plan for {params} parameters, {world} '
                   f"rank(s): {row['device'] / gib:.2f} GiB on the device, {row['host'] / gib:.2f} GiB host, "
                   f"{row.get('nvme', 0) / gib:.2f} GiB NVMe per rank; `dsfast plan` shows every option)")
    return choice


def _check_state_precision(cfg):
    """state_precision "int8" was accepted while the device was "auto": the choice is checked as a config that
    said it would be (the int8 rows are offload rows, so the choice is one it applies to)."""
    from ...config.errors import dotted, raise_problems
    from ...config.master_precision import int8_state_errors
    chose = cfg.zero_optimization.offload_optimizer.device
    problems = [(dotted(path), f'{msg} (offload_optimizer.device "auto" chose "{chose}" here)')
                for path, msg in int8_state_errors(cfg)]
    if problems:
        raise_problems(problems)


def _slowest_over_ranks(choice):
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return choice
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, choice)
    return max(every, key=ORDER.index)
