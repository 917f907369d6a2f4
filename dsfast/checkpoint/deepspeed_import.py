"""DeepSpeed 0.19 checkpoints (stages 0-3, fp32 / bf16) -> full per-parameter fp32 masters and optimizer state,
read through restricted unpickling (ds_unpickle.py). load_checkpoint uses it for a DeepSpeed folder; `dsfast
convert-deepspeed SRC DST` writes it as a dsfast checkpoint.

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

from .ds_unpickle import ds_load
from .errors import CheckpointError

MODEL_STATES = "mp_rank_00_model_states.pt"
_DS_KEYS = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
            "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
            "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config",
            "ds_version", "checkpoint_parallel_dimensions"}


def is_deepspeed_checkpoint(path):
    return os.path.isfile(os.path.join(path, MODEL_STATES)) or bool(
        glob.glob(os.path.join(path, "zero_pp_rank_*_mp_rank_00_model_states.pt")))


def _ranked(path, pattern):
    found = {}
    for f in glob.glob(os.path.join(path, pattern)):
        m = re.search(r"zero_pp_rank_(\d+)_", os.path.basename(f))
        found[int(m.group(1))] = f
    return [found[r] for r in sorted(found)]


class DeepSpeedCheckpoint:
    """Everything of one DeepSpeed tag folder, as full tensors: params[name] = {"shape", "tensors": {"master",
    "exp_avg", ...} (flat fp32), "scalars": {"step": ...}}."""

    def __init__(self, path):
        self.path = path
        model_files = [os.path.join(path, MODEL_STATES)] if os.path.isfile(os.path.join(path, MODEL_STATES)) \
            else _ranked(path, "zero_pp_rank_*_mp_rank_00_model_states.pt")
        states = ds_load(model_files[0])
        self.module = dict(states["module"])
        self.global_steps = int(states.get("global_steps", 0))
        self.engine = {"global_steps": self.global_steps, "global_samples": int(states.get("global_samples", 0)),
                       "skipped_steps": int(states.get("skipped_steps", 0))}
        self.lr_scheduler = states.get("lr_scheduler")
        self.client_state = {k: v for k, v in states.items() if k not in _DS_KEYS}
        self.ds_config = states.get("ds_config") or {}
        optim_files = _ranked(path, "*zero_pp_rank_*_mp_rank_00_optim_states.pt")
        self.params, self.param_groups, self.loss_scale = {}, [], None
        if not optim_files:
            self.stage, self.world_size = 0, int(states.get("dp_world_size", 1))
            self._stage0(states)
        else:
            shards = [ds_load(f)["optimizer_state_dict"] for f in optim_files]
            self.stage, self.world_size = int(shards[0]["zero_stage"]), len(shards)
            scaler = shards[0].get("loss_scaler")
            self.loss_scale = getattr(scaler, "cur_scale", None)
            shapes = states["param_shapes"]
            if self.stage == 3:
                self._stage3(shards, shapes)
            else:
                self._stage12(shards, shapes)
        self.precision = "bf16" if (self.ds_config.get("bf16") or {}).get("enabled") else \
            "fp16" if (self.ds_config.get("fp16") or {}).get("enabled") else "fp32"

    def _param_names(self, states):
        buffers = set(states.get("buffer_names") or [])
        return [k for k in self.module if k not in buffers]

    def _stage0(self, states):
        opt = states.get("optimizer") or {}
        inner = opt.get("optimizer_state_dict", opt)
        names = self._param_names(states)
        masters = [t for group in opt.get("fp32_groups", []) for t in group] or [self.module[n] for n in names]
        if len(masters) != len(names):
            raise CheckpointError(f"{self.path}: {len(masters)} fp32 masters for {len(names)} parameters")
        index = [i for g in inner.get("param_groups", []) for i in g["params"]] or list(range(len(names)))
        for i, name in zip(index, names):
            state = inner.get("state", {}).get(i, {})
            self._add(name, tuple(self.module[name].shape), {"master": masters[i].float().reshape(-1)}, state)
        self.param_groups = [_hyper(g) for g in inner.get("param_groups", [])]
        if "cur_scale" in opt:
            self.loss_scale = opt["cur_scale"]

    def _add(self, name, shape, tensors, state):
        scalars = {}
        for key, value in state.items():
            if torch.is_tensor(value) and value.numel() > 1 or (torch.is_tensor(value) and key != "step"):
                tensors[key] = value.reshape(-1)
            else:
                scalars[key] = {"value": float(value), "tensor": "float32", "shape": []}
        self.params[name] = {"shape": list(shape), "tensors": tensors, "scalars": scalars}

    def _stage12(self, shards, shapes):
        for g, group_shapes in enumerate(shapes):
            pieces = {name: [] for name in group_shapes}
            keys, scalars = None, {}
            for shard in shards:
                flat = shard["single_partition_of_fp32_groups"][g]
                state = shard["base_optimizer_state"]["state"][g]
                # the state may keep the alignment padding the saved partition dropped: compare by >=
                flat_state = {k: v for k, v in state.items()
                              if torch.is_tensor(v) and v.dim() > 0 and v.numel() >= flat.numel()}
                keys = list(flat_state)
                scalars = {k: v for k, v in state.items() if k not in flat_state}
                for name, frag in shard["param_slice_mappings"][g].items():
                    lo, n = int(frag.start), int(frag.numel)
                    pieces[name].append({"master": flat[lo:lo + n], **{k: v[lo:lo + n] for k, v in flat_state.items()}})
            for name, shape in group_shapes.items():
                tensors = {k: torch.cat([p[k] for p in pieces[name]]).float() for k in ["master"] + keys}
                self._check(name, shape, tensors["master"])
                self._add(name, tuple(shape), tensors, scalars)
            self.param_groups.append(_hyper(shards[0]["base_optimizer_state"]["param_groups"][g]))

    def _stage3(self, shards, shapes):
        world = len(shards)
        for g, group_shapes in enumerate(shapes):
            offset = 0
            states = [s["optimizer_state_dict"]["state"][g] for s in shards]
            flats = [s["fp32_flat_groups"][g] for s in shards]
            keys = [k for k, v in states[0].items() if torch.is_tensor(v) and v.numel() == flats[0].numel()]
            scalars = {k: v for k, v in states[0].items() if k not in keys}
            for name, shape in group_shapes.items():
                numel = int(torch.Size(shape).numel())
                part = -(-numel // world)
                tensors = {"master": torch.cat([f[offset:offset + part] for f in flats])[:numel].float()}
                for k in keys:
                    tensors[k] = torch.cat([st[k][offset:offset + part] for st in states])[:numel]
                offset += part
                self._add(name, tuple(shape), tensors, scalars)
            self.param_groups.append(_hyper(shards[0]["optimizer_state_dict"]["param_groups"][g]))

    def _check(self, name, shape, flat):
        if flat.numel() != torch.Size(shape).numel():
            raise CheckpointError(f"{self.path}: the fragments of {name!r} hold {flat.numel()} elements, its shape "
                                  f"{tuple(shape)} needs {torch.Size(shape).numel()}")

    def full_state_dict(self):
        """fp32 weights for every module key (masters for trained params, module values otherwise)."""
        out = {}
        for k, v in self.module.items():
            p = self.params.get(k)
            out[k] = p["tensors"]["master"].reshape(p["shape"]).clone() if p else (
                v.float() if v.is_floating_point() else v)
        return out


def _hyper(group):
    return {k: v for k, v in group.items() if k != "params"}


class _MemFile:
    def __init__(self, path, tensors):
        self.path, self._t = path, tensors

    def get(self, name):
        return self._t[name]


def _as_manifest(ds):
    params, tensors = {}, {}
    for name, p in ds.params.items():
        keys = {}
        for key, t in p["tensors"].items():
            keys[key] = f"{name}/{key}"
            tensors[keys[key]] = t
        numel = int(torch.Size(p["shape"]).numel())
        params[name] = {"shape": p["shape"], "slices": [{"rank": 0, "start": 0, "stop": numel, "file": "ds",
                                                         "keys": keys, "scalars": p["scalars"]}]}
    return params, tensors


@torch.no_grad()
def load_deepspeed_into(engine, path, strict, load_optimizer_states, load_lr_scheduler_states, module_only):
    from . import shards
    from .layout import checkpoint_layout, engine_after_load, masters_from_module
    ds = DeepSpeedCheckpoint(path)
    module = {k: v for k, v in ds.module.items()}
    if ds.stage == 3:        # partitioned module weights: the full fp32 ones, cast to the model's dtypes
        ref = engine.module.state_dict()
        module = {k: v.to(ref[k].dtype) if k in ref else v for k, v in ds.full_state_dict().items()}
    engine.module.load_state_dict(module, strict=strict)
    layout = checkpoint_layout(engine)
    if module_only:
        masters_from_module(engine, layout)
        engine_after_load(engine)
        return path, ds.client_state
    params, tensors = _as_manifest(ds)
    mem = _MemFile(path, tensors)
    shards.apply(layout, engine.optimizer, params, lambda _: mem, load_optimizer_states)
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


def consolidate_deepspeed(path):
    return DeepSpeedCheckpoint(path).full_state_dict()


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
    params, tensors = _as_manifest(ds)
    tmp = commit.tmp_dir(dst, tag, "convert")
    os.makedirs(tmp, exist_ok=True)
    optim = manifest.optim_file(0)
    for p in params.values():
        p["slices"][0]["file"] = optim
    files = {optim: write_file(os.path.join(tmp, optim), tensors),
             manifest.MODEL_FILE: write_file(os.path.join(tmp, manifest.MODEL_FILE),
                                             {k: v.contiguous() for k, v in (ds.full_state_dict() if ds.stage == 3
                                                                              else ds.module).items()})}
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
