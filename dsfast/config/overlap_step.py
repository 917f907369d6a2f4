"""Where zero_optimization.offload_optimizer.overlap_step (dsfast's own key) can apply: the host optimizer's step
runs in a worker thread after engine.step() returns, each unit waited for by the next forward (zero/step/overlap.py).
The optimizer being element-wise with a per-unit entry is checked when it is bound (owners/sharded.py)."""

PATH = ("zero_optimization", "offload_optimizer", "overlap_step")


def overlap_step_errors(cfg):
    """[(path, message)] where overlap_step true cannot apply."""
    off = cfg.zero_optimization.offload_optimizer
    if off is None or not off.overlap_step:
        return []
    stage, device = cfg.zero_stage, cfg.zero_optimization.offload_optimizer_device
    if stage not in (1, 2, 3) or device not in ("cpu", "nvme"):
        return [(PATH, f'true runs the offloaded host step behind the next forward: it needs ZeRO stage 1, 2 or 3 '
                       f'(stage is {stage}) with offload_optimizer.device "cpu" or "nvme" (it is "{device}"); set '
                       'overlap_step to false otherwise')]
    return []
