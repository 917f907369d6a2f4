"""What rank 0 saves beside the shards: module weights (safetensors; at stage 3 the buffers only) and the engine
state (JSON + tensors)."""
import json

import torch

from . import jsonable
from .errors import CheckpointError
from .snapshot import host_copy


def module_tensors(engine, exclude_frozen=False, snapshot=False, buffers_only=False):
    """The module's state_dict tensors; buffers_only: without the parameters (stage 3: every rank writes its own
    slices of them, module_slices.py)."""
    if buffers_only:
        from dsfast.zero.params.save16 import persistent_buffers
        sd = persistent_buffers(engine.module)
    else:
        sd = engine.module.state_dict()
    if exclude_frozen:
        frozen = {n for n, p in engine.module.named_parameters() if not p.requires_grad}
        sd = {k: v for k, v in sd.items() if k not in frozen}
    out = {}
    for k, v in sd.items():
        if not torch.is_tensor(v):
            raise CheckpointError(f"module.state_dict()[{k!r}] is a {type(v).__name__}, not a tensor; it cannot be "
                                  "stored in safetensors")
        out[k] = host_copy(f"module/{k}", v) if snapshot else v.detach()
    return out


def module_info(module):
    """Parameter names (with tied aliases) for consolidation: {"param_names": [...], "tied": {alias: first}}."""
    first, tied, names = {}, {}, []
    for name, p in module.named_parameters(remove_duplicate=False):
        names.append(name)
        if id(p) in first:
            tied[name] = first[id(p)]
        else:
            first[id(p)] = name
    return {"param_names": names, "tied": tied}


def _param_groups(optimizer, tensors):
    if optimizer is None:
        return None
    groups = []
    for i, g in enumerate(optimizer.param_groups):
        hyper = {k: v for k, v in g.items() if k != "params"}
        groups.append(jsonable.encode(hyper, f"optimizer.param_groups[{i}]", tensors, "param_groups/"))
    return groups


def engine_state(engine, client_state):
    """(JSON-able dict, tensors) of counters, loss scaler, LR scheduler, param groups and client_state; a value
    that would need pickling raises UnsafeStateError naming its key."""
    tensors = {}
    sched = engine.lr_scheduler
    sched_state = None
    if sched is not None:
        if not hasattr(sched, "state_dict"):
            raise CheckpointError(f"the lr_scheduler {type(sched).__name__} has no state_dict(); it cannot be "
                                  "checkpointed")
        sched_state = jsonable.encode(sched.state_dict(), "lr_scheduler.state_dict()", tensors, "lr_scheduler/")
    try:
        config = json.loads(json.dumps(engine.config.raw))
    except (TypeError, ValueError, AttributeError):
        config = None
    state = {
        "engine": jsonable.encode(engine.engine_state_dict(), "engine_state_dict()", tensors, "engine/"),
        "lr_scheduler": sched_state,
        "lr_scheduler_class": type(sched).__name__ if sched is not None else None,
        "param_groups": _param_groups(engine.optimizer, tensors),
        "client_state": jsonable.encode(client_state or {}, "client_state", tensors, "client/"),
        "ds_config": config,
    }
    return state, tensors


def dump_json(path, obj):
    """Write JSON (fsynced); returns {"size", "sha256"} of the bytes written."""
    import hashlib
    import os
    data = json.dumps(obj, indent=1, sort_keys=True, allow_nan=True).encode("utf-8")
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_json_checked(path, expect):
    import hashlib
    from .errors import CheckpointCorruptError
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise CheckpointCorruptError(f"{path}: cannot be read ({err})") from None
    if expect is not None:
        if len(data) != expect["size"]:
            raise CheckpointCorruptError(f"{path}: is {len(data)} bytes but the manifest says {expect['size']} "
                                         "(truncated or replaced)")
        if hashlib.sha256(data).hexdigest() != expect["sha256"]:
            raise CheckpointCorruptError(f"{path}: sha256 does not match the manifest (the file is corrupted)")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointCorruptError(f"{path}: not valid JSON ({err})") from None
