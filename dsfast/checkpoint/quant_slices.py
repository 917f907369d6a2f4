"""8-bit block-wise Adam moments (dsfast.optim.CPUAdam8bit) in the sliced checkpoint format, and loading them at
any world size and stage.

Save, as they are: the per-element uint8 codes are sliced like any per-element state; each record also stores the
fp32 scales of the blocks its element range touches ("<name>@<start>/<moment>_scales") and where its first element
sits in its block ("quant_phase"), so every saved element can be dequantized alone.
Load: each record's elements are dequantized (the code's value * their block's scale) into an fp32 buffer of the new
shard, remembering which saved block each came from; once all of a shard's records are in, every new block whose
elements all come from one saved block takes that block's codes and scale unchanged (exact: a resume on the same
grid), and the others (the grid moved: another world size, stage or bucketing) are re-quantized on the new grid (one
more rounding: at most 1/16 of the value, or below the smallest code half of that code; logged as a conversion).
Into a run with fp32 / 16-bit moments the dequantized values are written directly; fp32 / 16-bit moments loading into an 8-bit run are quantized
the same way.
"""
import torch

from ..optim import quant_state as qs
from .errors import CheckpointError
from ..ops.reference import adam8bit as q8

QUANT_BLOCK = q8.QUANT_BLOCK
_SIGNED = {"exp_avg": True, "exp_avg_sq": False}   # each moment's code format


def saved_scales(state, offset, n):
    """{key: (first block, block count)} of the scales a record [offset, offset + n) of a quantized state needs."""
    if not qs.is_quantized(state) or n <= 0:
        return {}
    first, last = offset // q8.QUANT_BLOCK, (offset + n - 1) // q8.QUANT_BLOCK
    return {k: (first, last - first + 1) for k in ("exp_avg_scales", "exp_avg_sq_scales")}


class Loader:
    """Routes the moment keys of saved slices: dequantizes 8-bit ones, buffers the values of an 8-bit run's shard
    until its records are all read, then re-quantizes it (flush)."""

    def __init__(self, optimizer, state_dtype):
        self.to_8bit = bool(getattr(optimizer, "states_8bit", False))
        self.state_dtype = state_dtype      # (param, saved dtype) -> the dtype a float state is kept in
        self.pending = {}                   # id(opt_param) -> (opt_param, state, {moment: buffers})
        self.converted = set()
        self.saved_shards = {}              # (file, saved shard ordinal) -> a small int for the source ids

    def takes(self, key):
        return key in qs.CODE_KEYS or (self.to_8bit and key in qs.FLOAT_KEYS)

    def add(self, key, f, s, lo, hi, r, state, dst_lo, dst_hi):
        """The saved slice s's key for elements [lo, hi) of the parameter, into the record r's shard."""
        if key.endswith("_scales"):
            return                          # read with its codes
        codes = source = block_scales = None
        if key in qs.FLOAT_KEYS:
            values = f.get(s["keys"][key]).reshape(-1)[lo - s["start"]:hi - s["start"]]
            moment, saved_kind, values = key, str(values.dtype).replace("torch.", ""), values.float()
        else:
            moment, saved_kind = key[:-len("_codes")], "int8"
            if "quant_phase" not in s:
                raise CheckpointError(f"{f.path}: {s['keys'][key]!r} holds 8-bit codes but the manifest's slice has no "
                                      "quant_phase (where its elements sit on their block grid); the checkpoint is "
                                      "incomplete")
            codes = f.get(s["keys"][key]).reshape(-1)[lo - s["start"]:hi - s["start"]]
            scales = f.get(s["keys"][moment + "_scales"]).reshape(-1)
            block = (torch.arange(lo - s["start"], hi - s["start"]) + int(s["quant_phase"])) // q8.QUANT_BLOCK
            block_scales = scales[block]
            values = q8.code_values(_SIGNED[moment])[codes.long()] * block_scales
            shard = self.saved_shards.setdefault((s["file"], s.get("quant_shard", 0)), len(self.saved_shards))
            source = (shard << 40) + int(s.get("quant_block0", 0)) + block
        if self.to_8bit:
            entry = self.pending.setdefault(id(r.opt_param), (r.opt_param, state, {}))
            n = r.opt_param.numel()
            bufs = entry[2].setdefault(moment, dict(values=torch.zeros(n), codes=torch.zeros(n, dtype=torch.uint8),
                                                    scales=torch.zeros(n), source=torch.full((n,), -1)))
            bufs["values"][dst_lo:dst_hi] = values
            if codes is not None:
                bufs["codes"][dst_lo:dst_hi] = codes
                bufs["scales"][dst_lo:dst_hi] = block_scales
                bufs["source"][dst_lo:dst_hi] = source
            else:
                self.converted.add((moment, saved_kind, "int8 (quantized)"))
            return
        dst = state.get(moment)
        if dst is None or dst.numel() != r.opt_param.numel():
            dst = state[moment] = torch.zeros(r.opt_param.shape, device=r.opt_param.device,
                                              dtype=self.state_dtype(r.opt_param, torch.float32))
        dst.view(-1)[dst_lo:dst_hi].copy_(values)
        self.converted.add((moment, "int8", str(dst.dtype).replace("torch.", "")))

    def flush(self, keep=None):
        """Re-quantize every buffered shard except `keep` (the one whose records are still being read)."""
        for k in [k for k in self.pending if keep is None or k != id(keep)]:
            param, state, moments = self.pending.pop(k)
            for moment, bufs in moments.items():
                codes, scales, moved = _requantize(bufs, _SIGNED[moment])
                for suffix, value in (("_codes", codes), ("_scales", scales)):
                    old = state.get(moment + suffix)
                    if torch.is_tensor(old) and old.shape == value.shape and old.dtype == value.dtype:
                        old.copy_(value)    # in place: an NVMe swap keeps the state's tensor objects
                    else:
                        state[moment + suffix] = value
                state.pop(moment, None)
                if moved:
                    self.converted.add((moment, "int8", "int8 (re-quantized on this run's blocks)"))


def _requantize(bufs, signed):
    """(codes, scales, whether any block was re-quantized) of a shard's buffers: a block whose elements all come from
    one saved block keeps its saved codes and scale; the others are quantized afresh."""
    codes, scales = q8.quantize(bufs["values"], signed)
    n = codes.numel()
    if n == 0:
        return codes, scales, False
    pad = q8.num_blocks(n) * q8.QUANT_BLOCK - n
    src = torch.nn.functional.pad(bufs["source"], (0, pad), value=-1).view(-1, q8.QUANT_BLOCK)
    valid = torch.nn.functional.pad(torch.ones(n, dtype=torch.bool), (0, pad)).view(-1, q8.QUANT_BLOCK)
    big = torch.iinfo(torch.int64).max
    lo = torch.where(valid, src, big).amin(dim=1)
    hi = torch.where(valid, src, -big).amax(dim=1)
    same = (lo == hi) & (lo >= 0)
    keep = same.repeat_interleave(q8.QUANT_BLOCK)[:n]
    codes = torch.where(keep, bufs["codes"], codes)
    first = torch.arange(scales.numel()) * q8.QUANT_BLOCK
    scales = torch.where(same, bufs["scales"][first], scales)
    return codes, scales, not bool(same.all())
