"""Streaming writers of export_sources Entries: one tensor fetched, written and freed at a time.

write_hf_dir: the Hugging Face layout from_pretrained reads: `model.safetensors`, or, past max_shard_size,
`model-00001-of-0000N.safetensors` + `model.safetensors.index.json` ({"metadata": {"total_size"}, "weight_map"}),
split as huggingface_hub's split_torch_state_dict_into_shards splits (in order; a new file when the next tensor would
pass the limit; a tensor larger than the limit alone in its own file). A tied weight is written once, under its
first name (save_pretrained drops the duplicates; from_pretrained ties them again). Everything is written into a
hidden folder inside the output folder and renamed into place at the end, the index last: an interrupted export
leaves no file that looks complete. write_one_file: one safetensors file, written under a temporary name, renamed.
"""
import json
import os
import shutil
import uuid

import torch

from .safetensors_io import Deferred, write_file

OUTPUT_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
                 "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}   # huggingface_hub's parse_size_to_int units


def parse_max_shard_size(value):
    """An int (bytes) or Hugging Face's "5GB" / "500MB" / "10KB" / "1TB" (decimal units) -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and value.strip().isdigit():
        size = int(value.strip())
    elif isinstance(value, str) and value.strip()[-2:].upper() in _UNITS:
        try:
            size = int(float(value.strip()[:-2]) * _UNITS[value.strip()[-2:].upper()])
        except ValueError:
            size = None
    else:
        size = None
    if size is None or size <= 0:
        raise ValueError(f"max_shard_size {value!r}: give a positive number of bytes or a size such as \"5GB\", "
                         "\"500MB\" (units TB, GB, MB, KB)")
    return size


def output_dtype(value):
    """fp32 / bf16 / fp16 (or their torch names, or a torch.dtype) -> torch.dtype."""
    name = str(value).replace("torch.", "").lower() if not isinstance(value, torch.dtype) else value
    found = OUTPUT_DTYPES.get(name) if isinstance(name, str) else name
    if found not in OUTPUT_DTYPES.values():
        raise ValueError(f"Unsupported output dtype {value!r}. Choose one of: {', '.join(sorted(OUTPUT_DTYPES))}")
    return found


def _out_dtype(entry, dtype):
    return dtype if entry.dtype.is_floating_point else entry.dtype


def _nbytes(entry, dtype):
    return entry.numel * torch.empty(0, dtype=_out_dtype(entry, dtype)).element_size()


def plan_shards(entries, dtype, max_shard_size):
    """[[entry, ...] per file] and the total size in bytes, as huggingface_hub splits (aliases left out)."""
    limit = parse_max_shard_size(max_shard_size)
    shards, current, current_size, total = [], [], 0, 0
    for e in entries:
        if e.alias_of is not None:
            continue
        size = _nbytes(e, dtype)
        total += size
        if size > limit:
            shards.append([e])
            continue
        if current and current_size + size > limit:
            shards.append(current)
            current, current_size = [], 0
        current.append(e)
        current_size += size
    if current:
        shards.append(current)
    return shards, total


def shard_names(n, weights_name="model.safetensors"):
    stem, ext = os.path.splitext(weights_name)
    return [weights_name] if n == 1 else [f"{stem}-{i + 1:05d}-of-{n:05d}{ext}" for i in range(n)]


class _Buffers:
    """One reused 1-D buffer per dtype, as long as the largest tensor of that dtype: every tensor of an export is
    fetched (and cast) into the same memory, so resident memory stays at the largest tensor (fresh tensors
    freed one after another leave the C allocator's heap fragmented and the process larger)."""

    def __init__(self, entries, dtype):
        self.need = {}
        for e in entries:
            for d in {e.dtype, _out_dtype(e, dtype)}:
                self.need[d] = max(self.need.get(d, 0), e.numel)
        self.have = {}

    def get(self, dtype):
        if dtype not in self.have:
            self.have[dtype] = torch.empty(self.need[dtype], dtype=dtype)
        return self.have[dtype]


def _deferred(entry, dtype, buffers):
    out = _out_dtype(entry, dtype)

    def fetch():
        t = entry.fetch(buffers.get(entry.dtype)).reshape(-1)
        if out == entry.dtype:
            return t
        cast = buffers.get(out)[:entry.numel]
        cast.copy_(t)
        return cast
    return Deferred(fetch, out, entry.numel, shape=entry.shape)


def module_tensors_deferred(entries, dtype=torch.float32):
    """{name: Deferred} of the non-alias entries for write_file, fetched one at a time into reused buffers."""
    buffers = _Buffers(entries, dtype)
    return {e.name: _deferred(e, dtype, buffers) for e in entries if e.alias_of is None}


def write_one_file(entries, path, dtype=torch.float32, fault=None):
    """All non-alias entries into the safetensors file `path` (temporary name, renamed at the end)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        write_file(tmp, module_tensors_deferred(entries, dtype),
                   metadata={"format": "pt"}, fault=fault)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_hf_dir(entries, out_dir, dtype=torch.float32, max_shard_size="5GB", fault=None,
                 weights_name="model.safetensors", torch_format=False):
    """Write the entries into out_dir in the Hugging Face layout (max_shard_size None: one file). Returns the
    files written. torch_format: torch.save files (pytorch_model.bin and its shards, DeepSpeed's default), each
    built in memory one file at a time; a tied weight's second names go into its file, sharing its tensor."""
    shards, total = plan_shards(entries, dtype, max_shard_size if max_shard_size is not None else 1 << 62)
    names = shard_names(len(shards), weights_name)
    index_name = f"{weights_name}.index.json"
    aliases = {}
    for e in entries:
        if e.alias_of is not None and torch_format:
            aliases.setdefault(e.alias_of, []).append(e.name)
    os.makedirs(out_dir, exist_ok=True)
    tmp = os.path.join(out_dir, f".dsfast-export-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    weight_map = {}
    buffers = _Buffers(entries, dtype)
    try:
        for name, shard in zip(names, shards):
            path = os.path.join(tmp, name)
            for e in shard:
                weight_map.update({k: name for k in [e.name] + aliases.get(e.name, [])})
            if torch_format:
                _save_torch_shard(path, shard, aliases, dtype, fault)
            else:
                write_file(path, {e.name: _deferred(e, dtype, buffers) for e in shard}, metadata={"format": "pt"},
                           fault=fault)
        if len(shards) > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            with open(os.path.join(tmp, index_name), "w", encoding="utf-8") as f:
                f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
        _move_into_place(tmp, out_dir, names, index_name if len(shards) > 1 else None, weights_name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return names + ([index_name] if len(shards) > 1 else [])


def _save_torch_shard(path, shard, aliases, dtype, fault):
    sd = {}
    for e in shard:
        sd[e.name] = e.fetch().to(_out_dtype(e, dtype))
        for alias in aliases.get(e.name, []):
            sd[alias] = sd[e.name]
        if fault:
            fault("tensor")
    torch.save(sd, path)


def _move_into_place(tmp, out_dir, names, index_name, weights_name):
    """The old index goes first and the new one comes last, so no moment shows an index naming files that are
    not all there; files of an earlier export with another shard count are removed (as save_pretrained does)."""
    stem, ext = os.path.splitext(weights_name)
    old_index = os.path.join(out_dir, f"{weights_name}.index.json")
    if os.path.exists(old_index):
        os.remove(old_index)
    for name in names:
        os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    for old in os.listdir(out_dir):
        stale = old == weights_name or (old.startswith(stem + "-") and old.endswith(ext) and "-of-" in old)
        if stale and old not in names:
            os.remove(os.path.join(out_dir, old))
    if index_name is not None:
        os.replace(os.path.join(tmp, index_name), os.path.join(out_dir, index_name))
