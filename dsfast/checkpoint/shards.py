"""A rank's slices of masters and optimizer state <-> named flat tensors, and resharding at load.

Save: every SliceRecord gives tensors "<name>@<start>/master" and "<name>@<start>/<state key>" (1-D, the record's
elements, in their own dtype: 16-bit masters and states stay 16-bit) plus JSON scalars (step). Load: every record of
the NEW layout is filled from the saved slices that overlap its element range, whichever world size and stage wrote
them, so a checkpoint reshapes at load. Each value is converted explicitly to the dtype the run keeps it in (its
master's; its optimizer's state dtype): bf16 masters and moments load into an fp32-master run widened exactly, fp32
ones into a bf16_master_weights_and_grads run rounded to nearest even; `apply` returns the conversions it made.
"""
import warnings

import torch

from .errors import CheckpointError
from .safetensors_io import Deferred
from .quant_slices import QUANT_BLOCK, Loader, saved_scales
from .snapshot import host_copy


def _per_element(key, value, opt_param):
    return (torch.is_tensor(value) and value.numel() == opt_param.numel() and key != "step"
            and (value.dim() > 0 or opt_param.dim() == 0))


def _scalar(where, key, value):
    if torch.is_tensor(value):
        if value.numel() != 1:
            raise CheckpointError(f"{where}: optimizer state {key!r} is a tensor of shape {tuple(value.shape)}, "
                                  "neither per-element nor a scalar; the checkpoint layer cannot slice it")
        return {"value": value.item(), "tensor": str(value.dtype).replace("torch.", ""), "shape": list(value.shape)}
    if isinstance(value, (bool, int, float)):
        return {"value": value, "tensor": None}
    raise CheckpointError(f"{where}: optimizer state {key!r} is a {type(value).__name__}; only tensors and "
                          "numbers can be checkpointed")


def collect(layout, optimizer, file_name, snapshot=False, use=None):
    """(tensors, slice entries) for this rank's records; snapshot=True copies to host memory (async saves).
    use(opt_param): the owner's visitor (states on NVMe): the values become safetensors_io.Deferred, fetched unit by
    unit as the file is written (snapshot=True: copied now, unit by unit)."""
    tensors, entries, shard_ids = {}, [], {}
    for r in layout.records:
        n = r.stop - r.start
        base = f"{r.name}@{r.start}"
        if use is not None and snapshot:
            use(r.opt_param)

        def part(t, name, r=r, n=n, start=None):
            a = r.opt_offset if start is None else start
            if use is not None and not snapshot:
                def fetch():
                    use(r.opt_param)   # t is the same object after: its storage is the unit's buffer now
                    return t.detach().reshape(-1)[a:a + n]
                return Deferred(fetch, t.dtype, n)
            flat = t.detach().reshape(-1)[a:a + n]
            return host_copy(name, flat) if snapshot else flat

        keys = {"master": f"{base}/master"}
        tensors[keys["master"]] = part(r.opt_param, keys["master"])
        scalars = {}
        state = optimizer.state.get(r.opt_param, {}) if optimizer is not None else {}
        quant = saved_scales(state, r.opt_offset, n)
        for key, value in state.items():
            if key in quant:   # 8-bit moments: the scales of the blocks this record touches (quant_slices.py)
                first, count = quant[key]
                keys[key] = f"{base}/{key}"
                tensors[keys[key]] = part(value, keys[key], n=count, start=first)
            elif _per_element(key, value, r.opt_param):
                keys[key] = f"{base}/{key}"
                tensors[keys[key]] = part(value, keys[key])
            else:
                scalars[key] = _scalar(f"parameter {r.name!r}", key, value)
        entry = {"name": r.name, "shape": list(r.shape), "start": r.start, "stop": r.stop,
                 "file": file_name, "keys": keys, "scalars": scalars}
        if quant:   # where the record sits on its shard's block grid (quant_slices.py)
            shard_no = shard_ids.setdefault(id(r.opt_param), len(shard_ids))
            entry.update(quant_phase=r.opt_offset % QUANT_BLOCK, quant_block0=r.opt_offset // QUANT_BLOCK,
                         quant_shard=shard_no)
        entries.append(entry)
    return tensors, entries


def _scalar_value(info, device):
    if info.get("tensor") is None:
        return info["value"]
    return torch.tensor(info["value"], dtype=getattr(torch, info["tensor"]), device=device).reshape(
        info.get("shape", []))


def state_dtype(optimizer, param, saved_dtype):
    """The dtype `optimizer` keeps a per-element state of `param` in: its own rule where it has one (dsfast's CPU
    optimizers: fp32_optimizer_states), else the param's (torch's optimizers make zeros_like(param)); a state that
    is not floating point keeps its saved dtype."""
    if not saved_dtype.is_floating_point:
        return saved_dtype
    own = getattr(optimizer, "state_dtype", None)
    return own(param) if callable(own) else param.dtype


def log_converted(where, converted):
    """The one log line of what a load converted on the way (apply's return), e.g. bf16 moments into an fp32-state
    run, or fp32 moments quantized into an 8-bit one."""
    if converted:
        from ..utils.log import log_dist
        log_dist(f"{where}: converted on load: " + ", ".join(f"{k} {a} -> {b}" for k, a, b in sorted(converted)),
                 ranks=[0])


def _release(f):
    """A mapped input: drop the pages just copied (they stay in the page cache)."""
    release = getattr(f, "release", None)
    if release is not None:
        release()


@torch.no_grad()
def apply(layout, optimizer, params_manifest, open_file, load_optimizer_states=True, use=None):
    """Fill every record's master (and, if asked, optimizer state) from the saved slices overlapping it. Returns
    {(key, saved dtype, loaded dtype)} of the values converted on the way (e.g. bf16 moments into fp32 ones).
    use(opt_param): the owner's visitor (states on NVMe) brings the record's unit into memory first."""
    created, scalars_set, differing, converted = set(), set(), [], set()
    quant = Loader(optimizer, lambda p, dtype: state_dtype(optimizer, p, dtype))
    for r in layout.records:
        quant.flush(keep=r.opt_param)   # a shard's records are consecutive: the previous shard is complete
        if use is not None:
            use(r.opt_param)
        saved = params_manifest.get(r.name)
        if saved is None:
            raise CheckpointError(f"the checkpoint has no master weights for parameter {r.name!r} (it holds "
                                  f"{len(params_manifest)} parameters); was it saved from a different model?")
        if tuple(saved["shape"]) != tuple(r.shape):
            raise CheckpointError(f"parameter {r.name!r} has shape {tuple(r.shape)} here but "
                                  f"{tuple(saved['shape'])} in the checkpoint")
        state = optimizer.state[r.opt_param] if (optimizer is not None and load_optimizer_states) else None
        covered, first_scalars = 0, None
        for s in saved["slices"]:
            lo, hi = max(r.start, s["start"]), min(r.stop, s["stop"])
            if lo >= hi:
                continue
            f = open_file(s["file"])
            dst_lo, dst_hi = r.opt_offset + lo - r.start, r.opt_offset + hi - r.start
            for key, tensor_name in s["keys"].items():
                if key != "master" and state is None:
                    continue
                if key != "master" and quant.takes(key):   # 8-bit moments, or float ones into an 8-bit run
                    quant.add(key, f, s, lo, hi, r, state, dst_lo, dst_hi)   # (copies what it keeps)
                    _release(f)
                    continue
                src = f.get(tensor_name).reshape(-1)
                if src.numel() != s["stop"] - s["start"]:
                    raise CheckpointError(f"{f.path}: {tensor_name!r} has {src.numel()} elements, the manifest "
                                          f"says {s['stop'] - s['start']}")
                if key == "master":
                    dst = r.opt_param
                else:
                    dst = state.get(key)
                    if dst is None or (id(r.opt_param), key) not in created and dst.numel() != r.opt_param.numel():
                        dst = state[key] = torch.zeros(r.opt_param.shape, device=r.opt_param.device,
                                                       dtype=state_dtype(optimizer, r.opt_param, src.dtype))
                    created.add((id(r.opt_param), key))
                piece = src[lo - s["start"]:hi - s["start"]]
                if piece.dtype != dst.dtype:   # the explicit conversion (see the module docstring)
                    converted.add((key, str(piece.dtype).replace("torch.", ""), str(dst.dtype).replace("torch.", "")))
                    piece = piece.to(dst.dtype)
                dst.view(-1)[dst_lo:dst_hi].copy_(piece)
                _release(f)
            covered += hi - lo
            if first_scalars is None:
                first_scalars = s.get("scalars", {})
            elif s.get("scalars", {}) != first_scalars:
                differing.append(r.name)
        if covered != r.stop - r.start:
            raise CheckpointError(f"the checkpoint covers {covered} of the {r.stop - r.start} elements "
                                  f"[{r.start}, {r.stop}) of parameter {r.name!r}; its manifest is incomplete")
        if state is not None and first_scalars and id(r.opt_param) not in scalars_set:
            scalars_set.add(id(r.opt_param))
            for key, info in first_scalars.items():
                value = _scalar_value(info, r.opt_param.device)
                old = state.get(key)
                if torch.is_tensor(old) and torch.is_tensor(value) and old.shape == value.shape:
                    old.copy_(value)
                else:
                    state[key] = value
    quant.flush()
    converted |= quant.converted
    if differing:
        warnings.warn(f"saved slices of {len(differing)} parameter(s) (first: {differing[0]!r}) carry different "
                      "optimizer step counts; each merged shard takes the first slice's")
    return converted
