"""A checkpoint's full tensors as a list of Entries, each fetched on its own: the streaming export (export_hf.py)
and `consolidate` hold one whole tensor at a time, read from the slices that hold it.

Entry(name, shape, dtype, fetch, files): fetch(out=None) returns the tensor (never a view of an input file) and
drops the input pages it touched; given `out` (a 1-D buffer of `dtype`, at least numel long) it fills and returns
a view of it, so a writer reuses one buffer for every tensor (freeing and allocating a fresh tensor each time
leaves the C allocator's heap fragmented: tens of MB of resident memory more on a 40-tensor export); `files` are the input files it reads, checked (size, sha256) by `preflight` before
anything is written. Trained parameters come from the fp32 master slices (all ranks' pieces joined); frozen
parameters and buffers from the module weights (rank 0's file, or the stage-3 slices; floating-point parameters
as fp32). `alias_of` names the first name of a tied weight (its second names share that tensor).
"""
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch

from . import module_slices
from .errors import CheckpointError
from .safetensors_io import BY_CODE


@dataclass
class Entry:
    name: str
    shape: tuple
    dtype: torch.dtype
    fetch: Callable[..., torch.Tensor]
    files: List[str] = field(default_factory=list)
    alias_of: Optional[str] = None

    @property
    def numel(self):
        return _numel(self.shape)


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def target(out, numel, dtype):
    """Where a fetch writes: the given buffer's first numel elements, or a fresh tensor."""
    if out is None:
        return torch.empty(numel, dtype=dtype)
    if out.dtype != dtype or out.numel() < numel:
        raise ValueError(f"a fetch buffer of {out.numel()} x {out.dtype} cannot hold {numel} x {dtype}")
    return out[:numel]


def _master_entry(reader, name, entry):
    shape, numel = tuple(entry["shape"]), _numel(entry["shape"])
    covered = sum(s["stop"] - s["start"] for s in entry["slices"])
    if covered != numel:   # known from the manifest alone: an error before anything is written
        raise CheckpointError(f"{reader.dir}: the slices of {name!r} cover {covered} of {numel} elements")

    def fetch(out=None):
        flat = target(out, numel, torch.float32)
        for s in entry["slices"]:
            f = reader.file(s["file"])
            src = f.get(s["keys"]["master"]).reshape(-1)
            if src.numel() != s["stop"] - s["start"]:
                raise CheckpointError(f"{f.path}: {s['keys']['master']!r} has {src.numel()} elements, the "
                                      f"manifest says {s['stop'] - s['start']}")
            flat[s["start"]:s["stop"]] = src
            f.release()
        return flat.reshape(shape)
    return Entry(name, shape, torch.float32, fetch, sorted({s["file"] for s in entry["slices"]}))


def _module_file_entry(reader, key, as_fp32):
    name = reader.manifest["module_file"]
    info = reader.file(name).header[key]
    saved = BY_CODE[info["dtype"]]
    dtype = torch.float32 if as_fp32 and saved.is_floating_point else saved

    def fetch(out=None):
        f = reader.file(name)
        got = target(out, _numel(info["shape"]), dtype)
        got.copy_(f.get(key).reshape(-1))
        f.release()
        return got.reshape(info["shape"])
    return Entry(key, tuple(info["shape"]), dtype, fetch, [name])


def _sliced_module_entry(reader, key, entry):
    """A frozen parameter of a stage-3 checkpoint: joined from every rank's module slices, as fp32."""
    shape, numel = tuple(entry["shape"]), _numel(entry["shape"])
    files = sorted({s["file"] for s in entry["slices"]})
    probe = reader.file(entry["slices"][0]["file"]).header[entry["slices"][0]["key"]]
    saved = BY_CODE[probe["dtype"]]
    dtype = torch.float32 if saved.is_floating_point else saved

    def fetch(out=None):
        got = module_slices.read_range(reader, key, 0, numel, into=target(out, numel, dtype))
        for name in files:
            reader.file(name).release()
        return got.reshape(shape)
    return Entry(key, shape, dtype, fetch, files)


def dsfast_entries(reader, exclude_frozen=False):
    """Entries of a dsfast checkpoint (a load.CheckpointReader), in the model's state_dict order where the module
    file has it. Opens the module file (its header names the buffers); slice files open at preflight."""
    m = reader.manifest
    masters, tied = m["params"], m.get("tied", {})
    param_names = list(m.get("param_names", []))
    sliced = m.get("module_params", {})
    module_keys = list(reader.file(m["module_file"]).header)
    order = module_keys if not sliced else param_names + [k for k in module_keys if k not in set(param_names)]
    params = set(param_names)
    out, by_name = [], {}
    for key in order:
        if key in by_name:
            continue
        first = tied.get(key)
        if first is not None and first in by_name:
            src = by_name[first]
            e = Entry(key, src.shape, src.dtype, src.fetch, src.files, alias_of=first)
        elif key in masters:
            e = _master_entry(reader, key, masters[key])
        elif key in params:
            if exclude_frozen:
                continue
            e = _sliced_module_entry(reader, key, sliced[key]) if key in sliced else \
                _module_file_entry(reader, key, as_fp32=True)
        elif key in module_keys:
            e = _module_file_entry(reader, key, as_fp32=False)   # buffers as saved
        else:
            raise CheckpointError(f"{reader.dir}: parameter {key!r} is in the manifest's param_names but has "
                                  "neither master slices nor module weights")
        by_name[key] = e
        out.append(e)
    return out


def preflight(reader, entries):
    """Open and check (size, sha256) every file the entries read: a missing or truncated input is named before
    anything is written."""
    for name in sorted({f for e in entries for f in e.files}):
        reader.file(name).release()
