"""DeepSpeed 0.19 checkpoints (stages 0-3, fp32 / bf16) -> per-parameter fp32 masters and optimizer state, read
through restricted unpickling (ds_unpickle.py) from memory-mapped files, one fragment per rank, nothing joined until
asked: load_checkpoint uses it for a DeepSpeed folder (each rank copies the fragments overlapping its own ranges),
`dsfast consolidate` streams its weights, `dsfast convert-deepspeed SRC DST` writes it as a dsfast checkpoint
(one tensor's pages resident at a time).

Where DeepSpeed keeps the fp32 masters:
  stage 0 fp32   the module weights; Adam state per parameter in model_states['optimizer']
  stage 0 bf16   model_states['optimizer']['fp32_groups'] (per parameter) + 'optimizer_state_dict'
  stage 1/2      per rank, per group: a flat partition 'single_partition_of_fp32_groups' (+ flat Adam state);
                 'param_slice_mappings' names each parameter's fragment in it, in rank order
  stage 3        per rank, per group: 'fp32_flat_groups', each parameter split in ceil(numel / world) pieces
"""
import argparse
import glob
import os
import re
import sys

import torch

from .constants import (BASE_OPTIMIZER_STATE, BUFFER_NAMES, DS_VERSION, FP32_FLAT_GROUPS, FP32_GROUPS,
                        FROZEN_PARAM_FRAGMENTS, FROZEN_PARAM_SHAPES, MODEL_FILE_PREFIX, MODEL_FILE_SUFFIX,
                        OPTIM_FILE_SUFFIX, OPTIMIZER_STATE_DICT, PARAM_SHAPES, PARAM_SLICE_MAPPINGS, PARTITION_COUNT,
                        SINGLE_PARTITION_OF_FP32_GROUPS, ZERO_FILE_PREFIX, ZERO_STAGE)
from .ds_unpickle import ds_load
from .safetensors_io import Deferred
from .errors import CheckpointCorruptError, CheckpointError

MODEL_STATES = f"{MODEL_FILE_PREFIX}00{MODEL_FILE_SUFFIX}"                    # stages 0-2: the one model file
ZERO_MODEL_STATES = f"{ZERO_FILE_PREFIX}*_{MODEL_STATES}"                     # stage 3: one per rank
OPTIM_STATES = f"*{ZERO_FILE_PREFIX}*_{MODEL_FILE_PREFIX}00{OPTIM_FILE_SUFFIX}"   # (bf16_ / fp16_ prefixed too)
_RANK = re.compile(rf"{ZERO_FILE_PREFIX}(\d+)_")
_DS_KEYS = {"module", BUFFER_NAMES, "optimizer", PARAM_SHAPES, FROZEN_PARAM_SHAPES, "shared_params",
            FROZEN_PARAM_FRAGMENTS, "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
            "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config",
            DS_VERSION, "checkpoint_parallel_dimensions"}


def is_deepspeed_checkpoint(path):
    return os.path.isfile(os.path.join(path, MODEL_STATES)) or bool(
        glob.glob(os.path.join(path, ZERO_MODEL_STATES)))


def _ranked(path, pattern):
    found = {}
    for f in glob.glob(os.path.join(path, pattern)):
        m = _RANK.search(os.path.basename(f))
        found[int(m.group(1))] = f
    return [found[r] for r in sorted(found)]


class DeepSpeedCheckpoint:
    """One DeepSpeed tag folder, read lazily: the .pt files are memory-mapped and each parameter is a list of
    pieces, params[name] = {"shape", "pieces": [(start, stop, {"master": flat view, "exp_avg": ...})], "scalars"}
    (one piece per rank that holds part of it, in element order). Nothing is joined or copied until asked:
    tensor(name, key) joins one parameter; a resuming rank reads only the pieces overlapping its own ranges."""

    def __init__(self, path):
        self.path = path
        model_files = [os.path.join(path, MODEL_STATES)] if os.path.isfile(os.path.join(path, MODEL_STATES)) \
            else _ranked(path, ZERO_MODEL_STATES)
        optim_files = _ranked(path, OPTIM_STATES)
        for f in model_files[:1] + optim_files:     # every input named before any is read
            if not os.path.isfile(f):
                raise CheckpointCorruptError(f"{f}: missing")
        states = ds_load(model_files[0])
        self.module = dict(states["module"])
        self.global_steps = int(states.get("global_steps", 0))
        self.engine = {"global_steps": self.global_steps, "global_samples": int(states.get("global_samples", 0)),
                       "skipped_steps": int(states.get("skipped_steps", 0))}
        self.lr_scheduler = states.get("lr_scheduler")
        self.client_state = {k: v for k, v in states.items() if k not in _DS_KEYS}
        self.ds_config = states.get("ds_config") or {}
        self.shared = dict(states.get("shared_params") or {})     # {second name: first name} of tied weights
        self.params, self.param_groups, self.loss_scale = {}, [], None
        if not optim_files:
            self.stage, self.world_size = 0, int(states.get("dp_world_size", 1))
            self._stage0(states)
        else:
            first = ds_load(optim_files[0])[OPTIMIZER_STATE_DICT]
            self._check_ranks(optim_files, first.get(PARTITION_COUNT))
            shards = [first] + [ds_load(f)[OPTIMIZER_STATE_DICT] for f in optim_files[1:]]
            self.stage, self.world_size = int(shards[0][ZERO_STAGE]), len(shards)
            scaler = shards[0].get("loss_scaler")
            self.loss_scale = getattr(scaler, "cur_scale", None)
            shapes = states[PARAM_SHAPES]
            if self.stage == 3:
                self._stage3(shards, shapes)
            else:
                self._stage12(shards, shapes)
        self.precision = "bf16" if (self.ds_config.get("bf16") or {}).get("enabled") else \
            "fp16" if (self.ds_config.get("fp16") or {}).get("enabled") else "fp32"

    def _check_ranks(self, files, partition_count):
        """Every rank DeepSpeed partitioned over has its optimizer file (named if missing, before any output)."""
        counts = partition_count if isinstance(partition_count, (list, tuple)) else [partition_count]
        world = max(int(c) for c in counts) if counts and None not in counts else len(files)
        ranks = {int(_RANK.search(os.path.basename(f)).group(1)) for f in files}
        missing = sorted(set(range(world)) - ranks)
        if missing:
            pattern = os.path.basename(files[0]).replace(f"{ZERO_FILE_PREFIX}{min(ranks)}_", ZERO_FILE_PREFIX + "{}_")
            raise CheckpointCorruptError(f"{self.path}: DeepSpeed partitioned the optimizer over {world} ranks; the "
                                         f"file of rank {missing[0]} is missing ({pattern.format(missing[0])}"
                                         f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''})")

    def _param_names(self, states):
        buffers = set(states.get(BUFFER_NAMES) or [])
        return [k for k in self.module if k not in buffers]

    def _stage0(self, states):
        opt = states.get("optimizer") or {}
        inner = opt.get(OPTIMIZER_STATE_DICT, opt)
        names = self._param_names(states)
        masters = [t for group in opt.get(FP32_GROUPS, []) for t in group] or [self.module[n] for n in names]
        if len(masters) != len(names):
            raise CheckpointError(f"{self.path}: {len(masters)} fp32 masters for {len(names)} parameters")
        index = [i for g in inner.get("param_groups", []) for i in g["params"]] or list(range(len(names)))
        for i, name in zip(index, names):
            state = inner.get("state", {}).get(i, {})
            tensors, scalars = _split_state(state, lambda v: v.reshape(-1))
            numel = self.module[name].numel()
            self.params[name] = {"shape": list(self.module[name].shape), "scalars": scalars,
                                 "pieces": [(0, numel, {"master": masters[i].reshape(-1), **tensors})]}
        self.param_groups = [_hyper(g) for g in inner.get("param_groups", [])]
        if "cur_scale" in opt:
            self.loss_scale = opt["cur_scale"]

    def _stage12(self, shards, shapes):
        for g, group_shapes in enumerate(shapes):
            pieces = {name: [] for name in group_shapes}
            scalars = {}
            for shard in shards:
                flat = shard[SINGLE_PARTITION_OF_FP32_GROUPS][g]
                state = shard[BASE_OPTIMIZER_STATE]["state"][g]
                # the state may keep the alignment padding the saved partition dropped: compare by >=
                flat_state = {k: v for k, v in state.items()
                              if torch.is_tensor(v) and v.dim() > 0 and v.numel() >= flat.numel()}
                _, scalars = _split_state({k: v for k, v in state.items() if k not in flat_state}, None)
                for name, frag in shard[PARAM_SLICE_MAPPINGS][g].items():
                    lo, n = int(frag.start), int(frag.numel)
                    start = pieces[name][-1][1] if pieces[name] else 0
                    pieces[name].append((start, start + n, {"master": flat[lo:lo + n],
                                                            **{k: v[lo:lo + n] for k, v in flat_state.items()}}))
            for name, shape in group_shapes.items():
                held = pieces[name][-1][1] if pieces[name] else 0
                if held != torch.Size(shape).numel():
                    raise CheckpointError(f"{self.path}: the fragments of {name!r} hold {held} elements, its shape "
                                          f"{tuple(shape)} needs {torch.Size(shape).numel()}")
                self.params[name] = {"shape": list(shape), "pieces": pieces[name], "scalars": scalars}
            self.param_groups.append(_hyper(shards[0][BASE_OPTIMIZER_STATE]["param_groups"][g]))

    def _stage3(self, shards, shapes):
        world = len(shards)
        for g, group_shapes in enumerate(shapes):
            offset = 0
            states = [s[OPTIMIZER_STATE_DICT]["state"][g] for s in shards]
            flats = [s[FP32_FLAT_GROUPS][g] for s in shards]
            keys = [k for k, v in states[0].items() if torch.is_tensor(v) and v.numel() == flats[0].numel()]
            _, scalars = _split_state({k: v for k, v in states[0].items() if k not in keys}, None)
            for name, shape in group_shapes.items():
                numel = int(torch.Size(shape).numel())
                part = -(-numel // world)      # each rank holds ceil(numel / world) elements, the last padded
                pieces = []
                for r in range(world):
                    lo, hi = r * part, min((r + 1) * part, numel)
                    if lo < hi:
                        n = hi - lo
                        pieces.append((lo, hi, {"master": flats[r][offset:offset + n],
                                                **{k: states[r][k][offset:offset + n] for k in keys}}))
                offset += part
                self.params[name] = {"shape": list(shape), "pieces": pieces, "scalars": scalars}
            self.param_groups.append(_hyper(shards[0][OPTIMIZER_STATE_DICT]["param_groups"][g]))

    def tensor(self, name, key="master", out=None):
        """The whole flat `key` of parameter `name`, joined from its pieces (fp32 for the master); into `out`'s
        first elements if given (export_sources.target)."""
        from .export_sources import target
        p = self.params[name]
        numel = int(torch.Size(p["shape"]).numel())
        first = p["pieces"][0][2][key]
        out = target(out, numel, torch.float32 if key == "master" else first.dtype)
        for lo, hi, tensors in p["pieces"]:
            out[lo:hi] = tensors[key]
            drop_pages(tensors[key])
        return out

    def read_range(self, name, start, stop):
        """Elements [start, stop) of parameter `name` (fp32 master) from the fragments overlapping them; a
        module value (a frozen parameter) when it has no master; None when the checkpoint has neither."""
        p = self.params.get(name)
        if p is None:
            v = self.module.get(name)
            return None if v is None or v.numel() == 0 else v.reshape(-1)[start:stop].float()
        out = torch.empty(stop - start, dtype=torch.float32)
        for lo, hi, tensors in p["pieces"]:
            a, b = max(lo, start), min(hi, stop)
            if a < b:
                out[a - start:b - start] = tensors["master"][a - lo:b - lo]
                drop_pages(tensors["master"])
        return out

    def module_entries(self):
        """export_sources Entries of every module key: masters for trained parameters (joined per parameter),
        the module's values (floating point as fp32) otherwise."""
        from .export_sources import Entry
        out, by_name = [], {}
        for k, v in self.module.items():
            first = by_name.get(self.shared.get(k))
            if first is not None:      # a tied weight's second name (DeepSpeed's shared_params): the first's master
                out.append(Entry(k, first.shape, first.dtype, first.fetch, first.files, alias_of=first.name))
                continue
            if k in self.params:
                shape = tuple(self.params[k]["shape"])
                out.append(Entry(k, shape, torch.float32,
                                 lambda buf=None, k=k, s=shape: self.tensor(k, out=buf).reshape(s), [self.path]))
            else:
                dtype = torch.float32 if v.is_floating_point() else v.dtype
                out.append(Entry(k, tuple(v.shape), dtype, lambda buf=None, v=v, d=dtype: _copy_into(v, d, buf),
                                 [self.path]))
            by_name[k] = out[-1]
        return out

    def full_state_dict(self):
        """fp32 weights for every module key (masters for trained params, module values otherwise; a tied weight's
        names share one tensor)."""
        out = {}
        for e in self.module_entries():
            out[e.name] = out[e.alias_of] if e.alias_of is not None else e.fetch()
        return out


def _copy_into(v, dtype, buf):
    from .export_sources import target
    got = target(buf, v.numel(), dtype)
    got.copy_(v.reshape(-1))
    drop_pages(v)
    return got.reshape(v.shape)


def _streamed(tensors):
    """{key: Deferred} handing write_file each (memory-mapped) tensor in turn, the pages of the one written before
    dropped first: a conversion keeps one tensor's pages resident, not the checkpoint's."""
    last = []

    def make(t):
        def fetch():
            while last:
                drop_pages(last.pop())
            last.append(t)
            return t.contiguous().reshape(-1)
        return Deferred(fetch, t.dtype, t.numel(), shape=t.shape)
    return {k: make(t) for k, t in tensors.items()}


def _split_state(state, as_flat):
    """(per-element tensors, JSON scalars) of one parameter's optimizer state; as_flat=None: all are scalars."""
    tensors, scalars = {}, {}
    for key, value in state.items():
        if as_flat is not None and torch.is_tensor(value) and (value.numel() > 1 or key != "step"):
            tensors[key] = as_flat(value)
        else:
            scalars[key] = {"value": float(value), "tensor": "float32", "shape": []}
    return tensors, scalars


def drop_pages(t):
    """Drop the resident pages of a memory-mapped tensor's bytes (a streaming reader's memory stays at what it
    copies now). Pages are read again from the file if touched; nothing here is ever written."""
    from .pages import drop
    drop(t.data_ptr(), t.numel() * t.element_size())


def _hyper(group):
    return {k: v for k, v in group.items() if k != "params"}


class _MemFile:
    """The DeepSpeedCheckpoint's pieces as one "file" for shards.apply; release() drops the mapped pages of what
    was read since the last call."""

    def __init__(self, path, tensors):
        self.path, self._t, self._read = path, tensors, []

    def get(self, name):
        self._read.append(self._t[name])
        return self._t[name]

    def release(self):
        for t in self._read:
            drop_pages(t)
        self._read = []


def _as_manifest(ds, file="ds"):
    """(params manifest, {key: tensor}) as in a dsfast checkpoint: one slice per piece (a rank's fragment), so a
    resuming rank reads only the fragments overlapping its own ranges (shards.apply), and views stay views."""
    params, tensors = {}, {}
    for name, p in ds.params.items():
        slices = []
        for rank, (lo, hi, piece) in enumerate(p["pieces"]):
            keys = {key: f"{name}@{lo}/{key}" for key in piece}
            tensors.update({keys[key]: t for key, t in piece.items()})
            slices.append({"rank": rank, "start": lo, "stop": hi, "file": file, "keys": keys,
                           "scalars": p["scalars"]})
        params[name] = {"shape": p["shape"], "slices": slices}
    return params, tensors


@torch.no_grad()
def load_deepspeed_into(engine, path, strict, load_optimizer_states, load_lr_scheduler_states, module_only):
    from . import shards
    from .layout import checkpoint_layout, engine_after_load, masters_from_module
    ds = DeepSpeedCheckpoint(path)
    if engine.state_owner.partitions_params:     # a ZeRO-3 engine: each rank reads the elements it keeps
        _load_own_ranges(engine.module, ds, strict)
    else:
        module = {k: v for k, v in ds.module.items()}
        if ds.stage == 3:        # partitioned module weights: the full fp32 ones, cast to the model's dtypes
            ref = engine.module.state_dict()   # one fp32 tensor at a time, cast as it comes
            module = {e.name: e.fetch().to(ref[e.name].dtype) if e.name in ref else e.fetch()
                      for e in ds.module_entries()}
        engine.module.load_state_dict(module, strict=strict)
    layout = checkpoint_layout(engine)
    if module_only:
        masters_from_module(engine, layout)
        engine_after_load(engine)
        return path, ds.client_state
    params, tensors = _as_manifest(ds)
    mem = _MemFile(path, tensors)
    with engine.state_owner.visiting(writes=True) as use:   # states on NVMe: each unit read, filled, written back
        converted = shards.apply(layout, engine.optimizer, params, lambda _: mem, load_optimizer_states, use=use)
    shards.log_converted(path, converted)
    if load_optimizer_states and engine.optimizer is not None and ds.param_groups:
        if len(ds.param_groups) != len(engine.optimizer.param_groups):
            raise CheckpointError(f"{path}: {len(ds.param_groups)} DeepSpeed param groups, this optimizer has "
                                  f"{len(engine.optimizer.param_groups)}")
        for group, saved in zip(engine.optimizer.param_groups, ds.param_groups):
            for k in ("lr", "betas", "eps", "weight_decay", "momentum"):
                if k in saved and k in group:
                    group[k] = saved[k]
    state = dict(ds.engine, micro_steps=engine.micro_steps, loss_scaler=None)
    if engine.loss_scaler is not None and ds.loss_scale is not None:
        state["loss_scaler"] = {"cur_scale": float(ds.loss_scale), "cur_iter": ds.global_steps}
    engine.load_engine_state_dict(state)
    if load_lr_scheduler_states and engine.lr_scheduler is not None and ds.lr_scheduler is not None:
        engine.lr_scheduler.load_state_dict(ds.lr_scheduler)
    engine_after_load(engine)
    return path, ds.client_state


def _load_own_ranges(module, ds, strict):
    """A ZeRO-3 engine's slices of every parameter from the DeepSpeed fragments overlapping them (fp32 masters,
    cast by the partition), buffers from the module states; strict: every parameter and buffer found."""
    from dsfast.zero.params.save16 import load_partitioned_slices, persistent_buffers
    missing = load_partitioned_slices(module, ds.read_range)
    own = persistent_buffers(module)
    for key, buf in own.items():
        if key in ds.module:
            buf.copy_(ds.module[key])
        else:
            missing.append(key)
    if strict and missing:
        raise CheckpointError(f"{ds.path}: the DeepSpeed checkpoint has no weights for {missing[:5]} of this model "
                              "(ZeRO stage 3); load with load_module_strict=False to load what matches")


def consolidate_deepspeed(path):
    return DeepSpeedCheckpoint(path).full_state_dict()


def deepspeed_entries(path):
    """(export_sources Entries, preflight) of a DeepSpeed tag folder: its files are all opened (every missing or
    unreadable one named) when the folder is read, before anything is written."""
    return DeepSpeedCheckpoint(path).module_entries(), lambda: None


def convert(src, dst, tag=None):
    """Write DeepSpeed checkpoint `src` (a save_dir with `latest`, or a tag folder) as a dsfast checkpoint."""
    from . import commit, manifest, state_files
    from .safetensors_io import write_file
    if not is_deepspeed_checkpoint(src):
        tag = tag or commit.read_latest(src)
        if tag is None or not is_deepspeed_checkpoint(os.path.join(src, tag)):
            raise CheckpointError(f"{src!r} is neither a DeepSpeed tag folder nor a save_dir whose `latest` names one")
        src = os.path.join(src, tag)
    tag = tag or os.path.basename(os.path.normpath(src))
    ds = DeepSpeedCheckpoint(src)
    optim = manifest.optim_file(0)
    params, tensors = _as_manifest(ds, optim)
    tmp = commit.tmp_dir(dst, tag, "convert")
    os.makedirs(tmp, exist_ok=True)
    if ds.stage == 3:     # the module states hold no weights at stage 3: the joined fp32 masters, one at a time
        from .export_hf import module_tensors_deferred
        module = module_tensors_deferred(ds.module_entries())
    else:
        module = _streamed(ds.module)
    files = {optim: write_file(os.path.join(tmp, optim), _streamed(tensors)),
             manifest.MODEL_FILE: write_file(os.path.join(tmp, manifest.MODEL_FILE), module)}
    from . import jsonable
    extra = {}
    engine = dict(ds.engine, micro_steps=ds.global_steps, loss_scaler=(
        {"cur_scale": float(ds.loss_scale), "cur_iter": ds.global_steps} if ds.loss_scale is not None else None))
    state = {"engine": engine, "lr_scheduler": jsonable.encode(ds.lr_scheduler, "lr_scheduler", extra, "lr/"),
             "lr_scheduler_class": None,
             "param_groups": [jsonable.encode(g, f"param_groups[{i}]", extra, "pg/") for i, g in
                              enumerate(ds.param_groups)] or None,
             "client_state": jsonable.encode(ds.client_state, "client_state", extra, "client/"),
             "ds_config": ds.ds_config}
    if extra:
        files[manifest.ENGINE_TENSORS] = write_file(os.path.join(tmp, manifest.ENGINE_TENSORS), extra)
    files[manifest.ENGINE_FILE] = state_files.dump_json(os.path.join(tmp, manifest.ENGINE_FILE), state)
    m = {"format": manifest.FORMAT, "version": manifest.VERSION, "tag": tag, "world_size": ds.world_size,
         "stage": ds.stage, "replicated": True, "precision": ds.precision, "params": params, "files": files,
         "module_file": manifest.MODEL_FILE, "engine_file": manifest.ENGINE_FILE,
         "param_names": list(ds.params), "tied": {}, "converted_from": f"deepspeed {src}"}
    manifest.write(os.path.join(tmp, manifest.MANIFEST), m)
    commit.rename_into_place(tmp, os.path.join(dst, tag), "convert")
    commit.write_latest(dst, tag)
    return os.path.join(dst, tag)


def main(argv=None):
    p = argparse.ArgumentParser(prog="dsfast convert-deepspeed",
                                description="Convert a DeepSpeed 0.19 checkpoint (stages 0-3) into a dsfast one, "
                                            "without DeepSpeed and without running the pickles' code.")
    p.add_argument("src", help="DeepSpeed save_dir (reads `latest`) or one tag folder")
    p.add_argument("dst", help="dsfast save_dir to write (the tag folder and `latest`)")
    p.add_argument("--tag", default=None)
    args = p.parse_args(argv)
    try:
        out = convert(args.src, args.dst, args.tag)
    except CheckpointError as err:
        print(f"dsfast convert-deepspeed: error: {err}", file=sys.stderr)
        return 2
    print(f"dsfast convert-deepspeed: wrote {out}")
    return 0
