"""A checkpoint -> its full fp32 weights, with no GPU and no process group (DeepSpeed's zero_to_fp32), streamed:
one whole tensor in memory at a time, read from the slices that hold it (export_sources.py), written and freed
(export_hf.py).

Trained parameters come from the fp32 master slices (all ranks' pieces joined); frozen parameters and buffers
from rank 0's module weights (floating-point parameters as fp32). `consolidate` returns the state_dict (it loads
into the plain model with load_state_dict); `dsfast consolidate CKPT_DIR OUT` writes it without building it.
"""
import argparse
import os
import sys

import torch

from .errors import CheckpointError
from .load import CheckpointReader, resolve


def _checkpoint_path(ckpt_dir, tag):
    ckpt_dir = os.fspath(ckpt_dir)
    from .deepspeed_import import is_deepspeed_checkpoint
    if tag is None and (os.path.isfile(os.path.join(ckpt_dir, "manifest.json")) or is_deepspeed_checkpoint(ckpt_dir)):
        return ckpt_dir
    path, why = resolve(ckpt_dir, tag)
    if path is None:
        raise CheckpointError(f"consolidate: {why}")
    return path


def entries(ckpt_dir, tag=None, exclude_frozen=False):
    """(export_sources Entries, preflight()) of the checkpoint under ckpt_dir (`latest` when tag is None) or of a
    tag folder, dsfast's or DeepSpeed's. preflight() checks every input file the entries read."""
    path = _checkpoint_path(ckpt_dir, tag)
    if not os.path.isfile(os.path.join(path, "manifest.json")):
        from .deepspeed_import import deepspeed_entries, is_deepspeed_checkpoint
        if is_deepspeed_checkpoint(path):
            if exclude_frozen:
                raise CheckpointError(f"{path}: leaving frozen parameters out is supported for dsfast checkpoints; "
                                      "convert this DeepSpeed one first (dsfast convert-deepspeed SRC DST)")
            return deepspeed_entries(path)
    from .export_sources import dsfast_entries, preflight
    reader = CheckpointReader(path)
    found = dsfast_entries(reader, exclude_frozen)
    return found, lambda: preflight(reader, found)


def consolidate(ckpt_dir, tag=None, exclude_frozen=False):
    """Full fp32 state_dict of the checkpoint under ckpt_dir (`latest` when tag is None) or of a tag folder;
    exclude_frozen: without the parameters the engine did not train (buffers stay). The second names of a tied
    weight share the first one's tensor, as in the model's state_dict."""
    found, check = entries(ckpt_dir, tag, exclude_frozen)
    check()
    out = {}
    for e in found:
        out[e.name] = out[e.alias_of] if e.alias_of is not None else e.fetch()
    return out


def export(ckpt_dir, out, tag=None, dtype="fp32", max_shard_size="5GB", exclude_frozen=False, one_file=False,
           fault=None):
    """Stream the checkpoint's weights to `out`: a Hugging Face folder (export_hf.write_hf_dir), or with
    one_file=True one safetensors file. Every input file is checked before anything is written. Returns
    (entries written, output files)."""
    from .export_hf import output_dtype, parse_max_shard_size, write_hf_dir, write_one_file
    dtype = output_dtype(dtype)
    parse_max_shard_size(max_shard_size)          # a bad size is an error before any reading
    found, check = entries(ckpt_dir, tag, exclude_frozen)
    check()
    if one_file:
        write_one_file(found, out, dtype, fault=fault)
        return found, [out]
    return found, write_hf_dir(found, out, dtype, max_shard_size, fault=fault)


HELP = """Write a checkpoint's full weights (dsfast's or DeepSpeed's, any stage and world size) without a GPU,
streamed: one tensor in memory at a time (peak memory about the largest tensor plus the input pages being copied).

OUT is a folder in the Hugging Face layout that from_pretrained reads: model.safetensors, or past --max-shard-size
model-00001-of-0000N.safetensors + model.safetensors.index.json; a tied weight is written once, under its first
name (add the model's config.json to the folder and from_pretrained loads it). An OUT ending in .safetensors
is one safetensors file; with --torch, one torch.save file (built in memory).
Every input file is checked (size, sha256) before anything is written, and the output appears only when complete
(written under a temporary name, renamed at the end)."""


def main(argv=None):
    p = argparse.ArgumentParser(prog="dsfast consolidate", description=HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt_dir", help="the save_dir given to save_checkpoint (reads `latest`), or one tag folder")
    p.add_argument("out", help="output folder (Hugging Face layout), or a .safetensors file, or with --torch a file")
    p.add_argument("--tag", default=None, help="the checkpoint tag (default: the one `latest` names)")
    p.add_argument("--torch", action="store_true", help="write one torch.save file (built in memory) instead")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="floating-point tensors in this dtype (default fp32; integer buffers keep theirs)")
    p.add_argument("--max-shard-size", default="5GB",
                   help='largest output file, in bytes or as "5GB", "500MB" (default 5GB, as save_pretrained)')
    p.add_argument("--exclude-frozen", action="store_true",
                   help="leave out the parameters the engine did not train (buffers stay)")
    args = p.parse_args(argv)
    try:
        if args.torch:
            from .export_hf import output_dtype
            dtype = output_dtype(args.dtype)
            sd = consolidate(args.ckpt_dir, args.tag, args.exclude_frozen)
            cast = {}       # a tied weight's names keep sharing one tensor
            sd = {k: cast.setdefault(id(v), v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}
            tmp = f"{args.out}.tmp-{os.getpid()}"
            torch.save(sd, tmp)
            os.replace(tmp, args.out)
            count, numel, files = len(sd), sum(v.numel() for v in sd.values()), [args.out]
        else:
            found, files = export(args.ckpt_dir, args.out, args.tag, args.dtype, args.max_shard_size,
                                  args.exclude_frozen, one_file=args.out.endswith(".safetensors"))
            written = [e for e in found if e.alias_of is None]
            count, numel = len(written), sum(e.numel for e in written)
    except (CheckpointError, ValueError, OSError) as err:     # OSError: the output cannot be written there
        print(f"dsfast consolidate: error: {err}", file=sys.stderr)
        return 2
    print(f"dsfast consolidate: {count} tensors, {numel} elements -> {args.out} ({len(files)} file(s))")
    return 0
