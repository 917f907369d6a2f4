"""deepspeed.moe.utils: the optimizer parameter-group helpers, for dense models.

DeepSpeed marks expert parameters with `allreduce=False` (and a `group_name` naming their expert-parallel
group); such parameters need expert-parallel gradient reduction, which dsfast does not have, so the helpers that
build optimizer groups refuse them instead of training them as if they were dense.
"""
from typing import Any, Dict, List, Tuple, Union

import torch

from .layer import MoE, MoEUnsupportedError

DEFAULT_MAX_GROUP_SIZE = 178956971   # DeepSpeed's default (elements per MoE optimizer group)


def has_moe_layers(m: torch.nn.Module) -> Tuple[bool, int]:
    for module in m.modules():
        if isinstance(module, MoE):
            return True, module.num_experts
    return False, 0


def is_moe_param(param: torch.Tensor) -> bool:
    return hasattr(param, "allreduce") and not param.allreduce


def split_params_into_shared_and_expert_params(params):
    shared, expert = [], []
    for p in params:
        (expert if is_moe_param(p) else shared).append(p)
    return shared, expert


def split_params_grads_into_shared_and_expert_params(group):
    shared, expert = [], []
    for p in group:
        if p.grad is not None:
            (expert if is_moe_param(p) else shared).append(p.grad.to(p.dtype))
    return shared, expert


def is_moe_param_group(param_group) -> bool:
    return param_group.get("moe", False)


def _refuse_expert_params(param_groups, where):
    for gi, group in enumerate(param_groups):
        for pi, p in enumerate(group["params"]):
            if is_moe_param(p):
                raise MoEUnsupportedError(
                    f"{where}: param_groups[{gi}]['params'][{pi}] (shape {tuple(p.shape)}, group_name="
                    f"{getattr(p, 'group_name', None)!r}) is a DeepSpeed MoE expert parameter (allreduce=False); "
                    "dsfast has no expert parallelism and would average it over all ranks like a dense parameter. "
                    "Remove the MoE layers or run this program with DeepSpeed itself")


def split_params_into_different_moe_groups_for_optimizer(
        param_groups: Union[Dict[str, Any], Tuple[Dict[str, Any], ...], List[Dict[str, Any]]],
        max_group_size: Union[int, float, None] = DEFAULT_MAX_GROUP_SIZE) -> List[Dict[str, Any]]:
    """DeepSpeed's signature and, for a model without expert parameters, its result: the groups as a list (a
    dict becomes [dict], a tuple a list), each group's 'params' materialised as a list, nothing else changed."""
    if isinstance(param_groups, tuple):
        param_groups = list(param_groups)
    elif isinstance(param_groups, dict):
        param_groups = [param_groups]
    elif not isinstance(param_groups, list):
        raise ValueError(f"split_params_into_different_moe_groups_for_optimizer: param_groups must be a dict, a "
                         f"list or a tuple of dicts with a 'params' key, got {type(param_groups).__name__}")
    if max_group_size is not None and (isinstance(max_group_size, bool) or
                                       not isinstance(max_group_size, (int, float)) or max_group_size <= 0):
        raise ValueError(f"split_params_into_different_moe_groups_for_optimizer: max_group_size must be a "
                         f"positive number or None, got {max_group_size!r}")
    for gi, group in enumerate(param_groups):
        if not isinstance(group, dict) or "params" not in group:
            got = type(group).__name__ if not isinstance(group, dict) else f"a dict with keys {sorted(group)}"
            raise ValueError(f"split_params_into_different_moe_groups_for_optimizer: param_groups[{gi}] must be "
                             f"a dict with a 'params' key (e.g. {{'params': model.parameters()}}), got {got}")
        params = group["params"]
        # DeepSpeed stores a list back too, but iterates twice: a generator's params are lost there, kept here
        group["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
    _refuse_expert_params(param_groups, "split_params_into_different_moe_groups_for_optimizer")
    return param_groups


def configure_moe_param_groups(model_parameters: List):
    """DeepSpeed's helper that turns a parameter list into MoE-aware groups; dense models pass through."""
    if not isinstance(model_parameters, list):
        raise TypeError(f"configure_moe_param_groups: model_parameters must be a list, got "
                        f"{type(model_parameters).__name__}")
    for p in model_parameters:
        if not isinstance(p, (torch.Tensor, dict)):
            raise TypeError("param argument that would be given to the optimizer should be an iterable of Tensors "
                            f"or dicts, but got {type(p).__name__}")
    if not model_parameters:
        return model_parameters
    if isinstance(model_parameters[0], torch.nn.Parameter):
        return split_params_into_different_moe_groups_for_optimizer(
            {"params": model_parameters, "name": "dense-params"})
    if any("moe" in g for g in model_parameters if isinstance(g, dict)):
        _refuse_expert_params(model_parameters, "configure_moe_param_groups")
        return model_parameters
    return split_params_into_different_moe_groups_for_optimizer(model_parameters)


__all__ = ["has_moe_layers", "is_moe_param", "split_params_into_shared_and_expert_params",
           "split_params_grads_into_shared_and_expert_params", "split_params_into_different_moe_groups_for_optimizer",
           "is_moe_param_group", "configure_moe_param_groups", "MoEUnsupportedError"]
