"""The module weights of a ZeRO stage-3 checkpoint, written by every rank for its own slice (no rank gathers the
model: a save costs each rank its partition, in its model dtype, and nothing more).

Save: each rank's owner lists SliceRecords of its slice of every partitioned parameter (stage3.Stage3.module_slices);
they go to `model_rankNNNNN.safetensors` as "<name>@<start>/weight" (1-D, the slice's elements), and the manifest's
"module_params" says which file holds which elements of which parameter. Rank 0's model.safetensors keeps the
buffers. Load: a stage-3 engine reads only the element range each rank keeps, whatever world size wrote it; any other
reader (another stage, `dsfast consolidate`) joins the slices into whole tensors.
"""
import torch

from .errors import CheckpointError
from .layout import param_names
from .snapshot import host_copy


def model_file(rank):
    return f"model_rank{rank:05d}.safetensors"


def partitioned(engine):
    return bool(engine.state_owner.partitions_params)


def collect(engine, names, rank, exclude_frozen=False, snapshot=False):
    """(tensors, entries) of this rank's module slices; snapshot=True copies them to host buffers (async saves)."""
    tensors, entries = {}, []
    for r in engine.state_owner.module_slices(names, exclude_frozen):
        key = f"{r.name}@{r.start}/weight"
        flat = r.opt_param.detach().reshape(-1)[r.opt_offset:r.opt_offset + r.stop - r.start]
        tensors[key] = host_copy(key, flat) if snapshot else flat
        entries.append({"name": r.name, "shape": list(r.shape), "start": r.start, "stop": r.stop,
                        "file": model_file(rank), "key": key})
    return tensors, entries


def manifest_entries(reports):
    """{name: {"shape", "slices": [...]}} from every rank's report, slices in element order."""
    params = {}
    for rank, report in enumerate(reports):
        for s in report.get("module_slices") or []:
            entry = params.setdefault(s["name"], {"shape": s["shape"], "slices": []})
            if entry["shape"] != s["shape"]:
                raise CheckpointError(f"rank {rank} saved module weight {s['name']!r} with shape {s['shape']}, "
                                      f"another rank with {entry['shape']}")
            entry["slices"].append({"rank": rank, **{k: s[k] for k in ("start", "stop", "file", "key")}})
    for entry in params.values():
        entry["slices"].sort(key=lambda s: s["start"])
    return params


def read_range(reader, name, start, stop, into=None):
    """Elements [start, stop) of module weight `name` from the slices that overlap them, or None if the
    checkpoint has no such weight (a second name of a tied weight reads the first one's). into: a 1-D tensor of
    stop - start elements to fill (converted to its dtype) instead of a new one."""
    m = reader.manifest
    entry = m["module_params"].get(name) or m["module_params"].get(m.get("tied", {}).get(name))
    if entry is None:
        return None
    out, covered = into, 0
    for s in entry["slices"]:
        lo, hi = max(start, s["start"]), min(stop, s["stop"])
        if lo >= hi:
            continue
        src = reader.file(s["file"]).get(s["key"]).reshape(-1)
        if src.numel() != s["stop"] - s["start"]:
            raise CheckpointError(f"{reader.dir}: {s['key']!r} has {src.numel()} elements, the manifest says "
                                  f"{s['stop'] - s['start']}")
        if out is None:
            out = torch.empty(stop - start, dtype=src.dtype)
        out[lo - start:hi - start].copy_(src[lo - s["start"]:hi - s["start"]])
        covered += hi - lo
    if covered != stop - start:
        raise CheckpointError(f"{reader.dir}: the saved slices cover {covered} of the elements [{start}, {stop}) "
                              f"of module weight {name!r}; the manifest is incomplete")
    return out if out is not None else torch.empty(0)


def files_needed(engine, reader):
    """The slice files a stage-3 rank reads (opened and checked before anything is modified)."""
    m = reader.manifest
    names = set()
    for r in engine.state_owner.module_slices(param_names(engine.module), values=False):
        entry = m["module_params"].get(r.name) or m["module_params"].get(m.get("tied", {}).get(r.name))
        for s in (entry or {}).get("slices", []):
            if s["start"] < r.stop and r.start < s["stop"]:
                names.add(s["file"])
    return sorted(names)


def whole(reader):
    """{name: whole tensor} of every sliced module weight (tied second names included, as in state_dict)."""
    m = reader.manifest
    out = {}
    for name, entry in m["module_params"].items():
        numel = 1
        for d in entry["shape"]:
            numel *= int(d)
        out[name] = read_range(reader, name, 0, numel).reshape(entry["shape"])
    for alias, first in m.get("tied", {}).items():
        if first in out:
            out[alias] = out[first]
    return out
