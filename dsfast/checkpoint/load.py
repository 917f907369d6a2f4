"""load_checkpoint: read a checkpoint folder (any world size / stage) into this engine. Nothing is unpickled."""
import os
import warnings

import torch

from . import commit, jsonable, manifest, module_slices, shards, state_files
from .errors import CheckpointError
from .safetensors_io import SafeTensorsFile
from .layout import checkpoint_layout, engine_after_load, masters_from_module, states_visitor


class CheckpointReader:
    """One checkpoint folder: its manifest and its files, each read and checked against the manifest once."""

    def __init__(self, ckpt_dir):
        self.dir = ckpt_dir
        self.manifest = manifest.read(ckpt_dir)
        self._open = {}

    def file(self, name):
        if name not in self._open:
            info = self.manifest["files"].get(name)
            if info is None:
                raise CheckpointError(f"{os.path.join(self.dir, manifest.MANIFEST)}: lists no file {name!r}")
            self._open[name] = SafeTensorsFile(os.path.join(self.dir, name), info)
        return self._open[name]

    def engine_state(self):
        name = self.manifest["engine_file"]
        state = state_files.read_json_checked(os.path.join(self.dir, name), self.manifest["files"].get(name))
        tensors = {}
        if manifest.ENGINE_TENSORS in self.manifest["files"]:
            tensors = self.file(manifest.ENGINE_TENSORS).tensors()
        return state, tensors

    def module_state(self, copy=True, whole=True):
        """The module weights; copy=False: views of the file's buffer (to copy into the module while it is open).
        A checkpoint whose ranks wrote their own slices (stage 3) has its weights joined from them, unless `whole`
        is False (a stage-3 reader takes its slices itself: module_slices.read_range)."""
        f = self.file(self.manifest["module_file"])
        sd = {k: v.clone() for k, v in f.tensors().items()} if copy else f.tensors()
        if whole and self.sliced:
            sd.update(module_slices.whole(self))
        return sd

    @property
    def sliced(self):
        return "module_params" in self.manifest

    def close(self):
        self._open.clear()


def resolve(load_dir, tag):
    """(checkpoint folder, tag) or (None, reason)."""
    load_dir = os.fspath(load_dir)
    if tag is None:
        tag = commit.read_latest(load_dir)
        if tag is None:
            return None, f"no `latest` file in {load_dir!r}; pass a tag explicitly"
    tag = str(tag)
    found = commit.find_checkpoint(load_dir, tag)
    if found is None:
        return None, f"checkpoint {os.path.join(load_dir, tag)!r} does not exist"
    return found, tag


def load_checkpoint(engine, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                    load_lr_scheduler_states=True, load_module_only=False):
    """DeepSpeed's load_checkpoint -> (path, client_state); (None, None) with a warning if there is nothing."""
    path, why = resolve(load_dir, tag)
    if path is None:
        warnings.warn(f"load_checkpoint: {why}; nothing was loaded")
        return None, None
    if not os.path.exists(os.path.join(path, manifest.MANIFEST)):
        from .deepspeed_import import is_deepspeed_checkpoint, load_deepspeed_into
        if is_deepspeed_checkpoint(path):
            return load_deepspeed_into(engine, path, load_module_strict, load_optimizer_states,
                                       load_lr_scheduler_states, load_module_only)
    reader = CheckpointReader(path)
    try:
        return path, _load(engine, reader, load_module_strict, load_optimizer_states, load_lr_scheduler_states,
                           load_module_only)
    finally:
        reader.close()


@torch.no_grad()
def _load(engine, reader, strict, load_optimizer_states, load_lr_scheduler_states, module_only):
    # every file this rank needs is read and checked before anything is modified: never a partial load
    state, tensors = reader.engine_state()
    stage3 = engine.state_owner.partitions_params
    # load_state_dict copies it into the module; a stage-3 engine reads only its own slices of sliced weights
    module_sd = reader.module_state(copy=False, whole=not stage3)
    layout = checkpoint_layout(engine)
    if not module_only:
        for name in _files_needed(layout, reader.manifest["params"]):
            reader.file(name)
    if stage3 and reader.sliced:
        for name in module_slices.files_needed(engine, reader):
            reader.file(name)
    load_module_state(engine.module, module_sd, strict, reader.dir, stage3, reader)
    reader.file(reader.manifest["module_file"]).release()   # copied into the module: its pages can go
    client = jsonable.decode(state.get("client_state") or {}, tensors)
    if module_only:
        if not stage3:   # at stage 3 the partitions' masters followed the loaded slices already
            masters_from_module(engine, layout)
        engine_after_load(engine)
        return client
    visitor = states_visitor(engine, writes=True)   # states on NVMe: each unit read, filled, written back
    try:
        converted = shards.apply(layout, engine.optimizer, reader.manifest["params"], reader.file,
                                 load_optimizer_states, use=visitor.use if visitor is not None else None)
    finally:
        if visitor is not None:
            visitor.close()
    shards.log_converted(reader.dir, converted)
    if load_optimizer_states and engine.optimizer is not None and state.get("param_groups") is not None:
        _load_param_groups(engine.optimizer, jsonable.decode(state["param_groups"], tensors), reader.dir)
    engine.load_engine_state_dict(jsonable.decode(state["engine"], tensors))
    if load_lr_scheduler_states and engine.lr_scheduler is not None:
        if state.get("lr_scheduler") is None:
            warnings.warn(f"{reader.dir}: the checkpoint has no lr_scheduler state; the scheduler is unchanged")
        else:
            engine.lr_scheduler.load_state_dict(jsonable.decode(state["lr_scheduler"], tensors))
    engine_after_load(engine)
    return client


def _files_needed(layout, params):
    names = set()
    for r in layout.records:
        for s in params.get(r.name, {}).get("slices", []):
            if s["start"] < r.stop and r.start < s["stop"]:
                names.add(s["file"])
    return sorted(names)


def load_module_state(module, sd, strict, where, stage3=False, reader=None):
    """reader: the CheckpointReader `sd` came from (a stage-3 engine reads its own slices of a sliced one)."""
    if stage3 and reader is not None and reader.sliced:
        result = _load_own_slices(module, sd, strict, reader)
    elif stage3:
        from dsfast.zero.params.save16 import load_partitioned_state_dict
        result = load_partitioned_state_dict(module, sd, strict=strict)
    else:
        result = module.load_state_dict(sd, strict=strict)
    if not strict and (result.missing_keys or result.unexpected_keys):
        warnings.warn(f"{where}: module weights loaded with load_module_strict=False; missing "
                      f"{result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]}")


def _load_own_slices(module, buffers, strict, reader):
    """Stage 3 from a sliced checkpoint: each rank reads the elements it keeps of every weight (any world size
    wrote them), the buffers from rank 0's file. Returns torch's (missing_keys, unexpected_keys) result."""
    from torch.nn.modules.module import _IncompatibleKeys
    from dsfast.zero.params.save16 import load_partitioned_slices, persistent_buffers
    missing = load_partitioned_slices(module, lambda name, a, b: module_slices.read_range(reader, name, a, b))
    own = persistent_buffers(module)
    expected_buffers = set(own)
    for key in expected_buffers & set(buffers):
        own[key].copy_(buffers[key])
    missing += sorted(expected_buffers - set(buffers))
    names = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    tied = reader.manifest.get("tied", {})
    unexpected = sorted(set(buffers) - expected_buffers) + \
        sorted(n for n in reader.manifest["module_params"] if n not in names and n not in tied)
    result = _IncompatibleKeys(missing, unexpected)
    if strict and (missing or unexpected):
        raise CheckpointError(f"{reader.dir}: module weights do not match this model (ZeRO stage 3): missing "
                              f"{missing[:5]}, unexpected {unexpected[:5]}; load with load_module_strict=False to "
                              "load what matches")
    return result


def _load_param_groups(optimizer, groups, where):
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(f"{where}: the checkpoint has {len(groups)} optimizer param groups, this optimizer "
                              f"has {len(optimizer.param_groups)}; load with load_optimizer_states=False")
    for group, saved in zip(optimizer.param_groups, groups):
        for key, value in saved.items():
            group[key] = value
