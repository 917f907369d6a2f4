"""manifest.json: what a checkpoint holds and where (world size, stage, dtypes, every parameter's slices, and
every file's size and sha256). Loading trusts nothing that is not listed here."""
import json
import os

from .errors import CheckpointCorruptError, CheckpointError

FORMAT = "dsfast-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
MODEL_FILE = "model.safetensors"
ENGINE_FILE = "engine_state.json"
ENGINE_TENSORS = "engine_tensors.safetensors"


def optim_file(rank):
    return f"optim_rank{rank:05d}.safetensors"


QUANT_FIELDS = ("quant_phase", "quant_block0", "quant_shard")   # 8-bit moments' block grid (quant_slices.py)


def build(tag, layout_flags, precision, reports, extra):
    """The manifest from every rank's report ({"files": {...}, "slices": [...]}, in rank order)."""
    params, files = {}, {}
    for rank, report in enumerate(reports):
        files.update(report["files"])
        for s in report["slices"]:
            entry = params.setdefault(s["name"], {"shape": s["shape"], "slices": []})
            if entry["shape"] != s["shape"]:
                raise CheckpointError(f"rank {rank} saved parameter {s['name']!r} with shape {s['shape']}, another "
                                      f"rank with {entry['shape']}")
            entry["slices"].append({"rank": rank, **{k: s[k] for k in ("start", "stop", "file", "keys", "scalars")},
                                    **{k: s[k] for k in QUANT_FIELDS if k in s}})
    for entry in params.values():
        entry["slices"].sort(key=lambda s: s["start"])
    return {"format": FORMAT, "version": VERSION, "tag": tag, **layout_flags, "precision": precision,
            "params": params, "files": files, **extra}


def write(path, manifest):
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def read_json(path, what="file"):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path}: the checkpoint's {what} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointCorruptError(f"{path}: the checkpoint's {what} is not valid JSON ({err}); the file is "
                                     "truncated or corrupted") from None


def read(ckpt_dir):
    path = os.path.join(ckpt_dir, MANIFEST)
    m = read_json(path, "manifest")
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CheckpointCorruptError(f"{path}: not a dsfast checkpoint manifest (format {m.get('format')!r} "
                                     f"if a dict)" if isinstance(m, dict) else f"{path}: not a JSON object")
    if m.get("version", 0) > VERSION:
        raise CheckpointError(f"{path}: manifest version {m['version']} is newer than this dsfast reads "
                              f"({VERSION}); upgrade dsfast")
    return m
