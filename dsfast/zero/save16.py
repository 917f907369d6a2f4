"""engine.save_16bit_model: the whole model's weights in the model dtype, gathered from the partitions.

Parameters are gathered one at a time (a collective: every rank calls it) and copied to host memory on rank 0,
which writes the file: `*.safetensors` in the safetensors format (written here: an 8-byte little-endian header
length, a JSON header of name -> dtype / shape / byte offsets, then the raw little-endian bytes), anything else
with torch.save, as DeepSpeed does.
"""
import json
import os
import struct

import torch
import torch.distributed as dist

from .partitioned_param import gather, record_of

_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL"}


@torch.no_grad()
def gathered_state_dict(module, on_rank0_only=True, exclude_frozen=False):
    """{name: host tensor} of `module`'s parameters (whole) and persistent buffers; {} on other ranks when
    on_rank0_only. Tied parameters appear under every name, as in module.state_dict()."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    keep = rank == 0 or not on_rank0_only
    out = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if exclude_frozen and not p.requires_grad:
            continue
        rec = record_of(p)
        if rec is not None:
            rec.refs += 1
            gather([rec])
        if keep:
            out[name] = p.detach().to("cpu", copy=True)
        if rec is not None:
            rec.refs -= 1
            rec.release()
    if keep:
        params = {n for n, _ in module.named_parameters(remove_duplicate=False)}
        sd_names = set()
        for mod_name, m in module.named_modules(remove_duplicate=False):
            for b_name, b in m._buffers.items():
                if b is not None and b_name not in m._non_persistent_buffers_set:
                    full = f"{mod_name}.{b_name}" if mod_name else b_name
                    if full not in params and full not in sd_names:
                        sd_names.add(full)
                        out[full] = b.detach().to("cpu", copy=True)
    return out


def save_safetensors(tensors, path):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        if t.dtype not in _ST_DTYPES:
            raise TypeError(f"save_16bit_model: {name} has dtype {t.dtype}, which safetensors cannot hold")
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    """The inverse of save_safetensors ({name: tensor}), for checking a saved file without the safetensors
    package."""
    names = {v: k for k, v in _ST_DTYPES.items()}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        raw = torch.frombuffer(bytearray(data[a:b]), dtype=torch.uint8) if b > a else torch.empty(0, dtype=torch.uint8)
        out[name] = raw.view(names[meta["dtype"]]).reshape(meta["shape"])
    return out


def save_16bit_model(module, save_dir, save_filename, exclude_frozen=False):
    sd = gathered_state_dict(module, exclude_frozen=exclude_frozen)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        os.makedirs(save_dir, exist_ok=True)
        path = os.path.join(save_dir, save_filename)
        if save_filename.endswith(".safetensors"):
            save_safetensors(sd, path)
        else:
            torch.save(sd, path)
    if dist.is_initialized():
        dist.barrier()
    return True
