"""A checkpoint -> one full fp32 state_dict, with no GPU and no process group (DeepSpeed's zero_to_fp32).

Trained parameters come from the fp32 master slices (all ranks' pieces joined); frozen parameters and buffers
from rank 0's module weights (floating-point parameters as fp32). The result loads into the plain model with
load_state_dict. `dsfast consolidate CKPT_DIR OUT [--tag T] [--torch]` writes it as safetensors (or torch.save).
"""
import argparse
import os
import sys

import torch

from .errors import CheckpointError
from .load import CheckpointReader, resolve


def consolidate(ckpt_dir, tag=None, exclude_frozen=False):
    """Full fp32 state_dict of the checkpoint under ckpt_dir (`latest` when tag is None) or of a tag folder;
    exclude_frozen: without the parameters the engine did not train (buffers stay)."""
    ckpt_dir = os.fspath(ckpt_dir)
    if os.path.isfile(os.path.join(ckpt_dir, "manifest.json")) and tag is None:
        path = ckpt_dir
    else:
        path, why = resolve(ckpt_dir, tag)
        if path is None:
            raise CheckpointError(f"consolidate: {why}")
    if not os.path.isfile(os.path.join(path, "manifest.json")):
        from .deepspeed_import import consolidate_deepspeed, is_deepspeed_checkpoint
        if is_deepspeed_checkpoint(path):
            if exclude_frozen:
                raise CheckpointError(f"{path}: leaving frozen parameters out is supported for dsfast checkpoints; "
                                      "convert this DeepSpeed one first (dsfast convert-deepspeed SRC DST)")
            return consolidate_deepspeed(path)
    reader = CheckpointReader(path)
    module = reader.module_state()
    full = {}
    for name, entry in reader.manifest["params"].items():
        numel = 1
        for d in entry["shape"]:
            numel *= int(d)
        flat = torch.empty(numel, dtype=torch.float32)
        covered = 0
        for s in entry["slices"]:
            flat[s["start"]:s["stop"]] = reader.file(s["file"]).get(s["keys"]["master"]).reshape(-1)
            covered += s["stop"] - s["start"]
        if covered != numel:
            raise CheckpointError(f"{path}: the slices of {name!r} cover {covered} of {numel} elements")
        full[name] = flat.reshape(entry["shape"])
    tied = reader.manifest.get("tied", {})
    params = set(reader.manifest.get("param_names", []))
    out = {}
    for key, value in module.items():
        if key in full:
            out[key] = full[key]
        elif tied.get(key) in full:           # a second name of a tied weight shares the first one's master
            out[key] = full[tied[key]]
        elif key in params:
            if not exclude_frozen:            # a frozen parameter: its model-dtype weights, as fp32
                out[key] = value.float() if value.is_floating_point() else value
        else:
            out[key] = value                  # buffers as saved
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="dsfast consolidate",
                                description="Write a checkpoint's full fp32 weights as one file (no GPU needed).")
    p.add_argument("ckpt_dir", help="the save_dir given to save_checkpoint (reads `latest`), or one tag folder")
    p.add_argument("out", help="output file (.safetensors unless --torch)")
    p.add_argument("--tag", default=None, help="the checkpoint tag (default: the one `latest` names)")
    p.add_argument("--torch", action="store_true", help="write with torch.save instead of safetensors")
    args = p.parse_args(argv)
    try:
        sd = consolidate(args.ckpt_dir, args.tag)
    except CheckpointError as err:
        print(f"dsfast consolidate: error: {err}", file=sys.stderr)
        return 2
    if args.torch:
        torch.save(sd, args.out)
    else:
        from .safetensors_io import write_file
        write_file(args.out, {k: v.contiguous() for k, v in sd.items()}, metadata={"format": "pt"})
    n = sum(v.numel() for v in sd.values())
    print(f"dsfast consolidate: {len(sd)} tensors, {n} elements -> {args.out}")
    return 0
