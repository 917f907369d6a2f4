"""What every DeepSpeed-style LR schedule shares: the optimizer's param groups, per-group values, state.

Semantics as DeepSpeed's lr_schedules.py: `last_batch_iteration` starts at -1 and construction already writes
the schedule's starting lr into the optimizer; each `step()` advances the iteration by one and writes
`get_lr()`; the state is just {"last_batch_iteration"}.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Type

from pydantic import BaseModel, ValidationError

from dsfast.config.base import translate
from dsfast.config.errors import DsConfigError, dotted, format_problems


def param_groups_of(optimizer) -> List[dict]:
    """The param_groups of a torch optimizer or of a wrapper exposing `.optimizer` (as DeepSpeed accepts)."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is None and hasattr(optimizer, "optimizer"):
        groups = getattr(optimizer.optimizer, "param_groups", None)
    if not isinstance(groups, list) or not groups or not all(isinstance(g, dict) for g in groups):
        raise TypeError(f"an LR schedule needs an optimizer with param_groups (a torch.optim.Optimizer); got "
                        f"{type(optimizer).__name__}")
    return groups


def per_group(groups: List[dict], value: Any, name: str) -> List[float]:
    """A scalar applies to every group; a list must have one value per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(groups):
            raise ValueError(f"{name}: expected {len(groups)} values (one per optimizer param group), "
                             f"got {len(value)}")
        return [float(v) for v in value]
    return [float(value)] * len(groups)


def validated(model: Type[BaseModel], kwargs: Dict[str, Any], owner: str) -> BaseModel:
    """Check constructor arguments against the config schema, so direct use and ds_config agree."""
    try:
        return model.model_validate(kwargs)
    except ValidationError as err:
        probs = [(dotted((owner,) + loc), msg) for loc, msg in translate(err, model)]
        raise DsConfigError(format_problems(probs, None).replace("invalid ds_config", f"invalid {owner} arguments"),
                            probs) from None


def write_lr(groups: List[dict], lrs: Sequence[float]) -> List[float]:
    for group, lr in zip(groups, lrs):
        current = group.get("lr")
        if hasattr(current, "fill_"):     # tensor lr (torch allows it): keep it a tensor
            current.fill_(lr)
        else:
            group["lr"] = lr
    return [float(lr) for lr in lrs]


class LRSchedule:
    """Base: subclasses implement get_lr() for the current self.last_batch_iteration."""

    def __init__(self, optimizer, last_batch_iteration: int = -1):
        self.optimizer = optimizer
        self.param_groups = param_groups_of(optimizer)
        self.last_batch_iteration = int(last_batch_iteration)
        self._last_lr: List[float] = [float(g["lr"]) for g in self.param_groups]

    def get_lr(self) -> List[float]:  # pragma: no cover - abstract
        raise NotImplementedError

    def get_last_lr(self) -> List[float]:
        """The lr values last written into the optimizer."""
        return list(self._last_lr)

    def _apply(self) -> None:
        self._last_lr = write_lr(self.param_groups, self.get_lr())

    def step(self, last_batch_iteration: int = None) -> None:
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = int(last_batch_iteration)
        self._apply()

    def state_dict(self) -> Dict[str, int]:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if "last_batch_iteration" not in state:
            raise KeyError(f"{type(self).__name__}.load_state_dict: the state has no 'last_batch_iteration' "
                           f"(keys: {sorted(state)})")
        self.last_batch_iteration = int(state["last_batch_iteration"])
        if self.last_batch_iteration >= 0:
            # Re-write the lr for the restored position, so a resumed run uses it even before the next step.
            self._apply()
