"""Whole-model state dicts of a stage-3 module without holding the model: gathered one parameter at a time, or
loaded slice by slice.

gathered_state_dict: parameters gathered one at a time (a collective: every rank calls it) and copied to host
memory on rank 0 (what engine.save_16bit_model and DeepSpeed's consolidated 16-bit state dict write).
load_partitioned_state_dict: each rank keeps its own slice of whole tensors. load_partitioned_slices: each rank
reads only the element range it keeps (a checkpoint whose ranks wrote their own slices).
"""
import torch
import torch.distributed as dist

from .partitioned_param import gather, record_of
from .placeholders import refuse_placeholders


@torch.no_grad()
def gathered_state_dict(module, on_rank0_only=True, exclude_frozen=False):
    """{name: host tensor} of `module`'s parameters (whole) and persistent buffers; {} on other ranks when
    on_rank0_only. Tied parameters appear under every name, as in module.state_dict()."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    keep = rank == 0 or not on_rank0_only
    out = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if exclude_frozen and not p.requires_grad:
            continue
        rec = record_of(p)
        if rec is not None:
            rec.refs += 1
            gather([rec])
        if keep:
            out[name] = p.detach().to("cpu", copy=True)
        if rec is not None:
            rec.refs -= 1
            rec.release()
    if keep:
        out.update({k: b.detach().to("cpu", copy=True) for k, b in persistent_buffers(module).items()})
    return out


def persistent_buffers(module):
    """{name: buffer} of what module.state_dict() holds besides parameters (without calling it: a stage-3
    module's state_dict() holds placeholders while its parameters are partitioned)."""
    params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    out = {}
    for mod_name, m in module.named_modules(remove_duplicate=False):
        for b_name, b in m._buffers.items():
            if b is not None and b_name not in m._non_persistent_buffers_set:
                full = f"{mod_name}.{b_name}" if mod_name else b_name
                if full not in params and full not in out:
                    out[full] = b
    return out


@torch.no_grad()
def load_partitioned_state_dict(module, sd, strict=True):
    """module.load_state_dict for a stage-3 module without gathering: each rank copies its own slice of every
    parameter from the whole tensors in `sd` (every rank holds the same `sd`); buffers are copied as they are.
    Returns torch's (missing_keys, unexpected_keys) result."""
    from torch.nn.modules.module import _IncompatibleKeys
    refuse_placeholders(sd, list(sd))   # (a slice of an empty tensor would zero the shard)
    expected = set()
    for name, p in module.named_parameters(remove_duplicate=False):
        expected.add(name)
        if name not in sd:
            continue
        rec = record_of(p)
        if rec is None:
            p.copy_(sd[name])
            continue
        rec.set_from_full(sd[name].to(rec.shard.device, rec.shard.dtype))
    for mod_name, m in module.named_modules(remove_duplicate=False):
        for b_name, b in m._buffers.items():
            full = f"{mod_name}.{b_name}" if mod_name else b_name
            if b is not None and b_name not in m._non_persistent_buffers_set:
                expected.add(full)
                if full in sd:
                    b.copy_(sd[full])
    result = _IncompatibleKeys(sorted(expected - set(sd)), sorted(set(sd) - expected))
    if strict and (result.missing_keys or result.unexpected_keys):
        raise RuntimeError(f"load_state_dict (ZeRO stage 3): missing keys {result.missing_keys[:5]}, unexpected "
                           f"keys {result.unexpected_keys[:5]}")
    return result


@torch.no_grad()
def load_partitioned_slices(module, read_range):
    """Each rank's slice of every partitioned parameter of `module` from `read_range(name, start, stop)`: the
    saved elements [start, stop) of the flattened parameter, or None when the checkpoint has no such parameter.
    Returns the names of the parameters it had none for (the caller decides whether that is an error)."""
    missing, seen = [], set()
    for name, p in module.named_parameters():
        rec = record_of(p)
        if rec is None or id(p) in seen:
            continue
        seen.add(id(p))
        values = read_range(name, *rec.owned_range())
        if values is None:
            missing.append(name)
            continue
        rec.set_slice(values)
    return missing
