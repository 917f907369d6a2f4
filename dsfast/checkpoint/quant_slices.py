"""8-bit block-wise Adam moments (dsfast.optim.CPUAdam8bit) in the sliced checkpoint format, and loading them at
any world size and stage.

Save, as they are: the per-element uint8 codes are sliced like any per-element state; each record also stores the
fp32 scales of the blocks its element range touches ("<name>@<start>/<moment>_scales") and where its first element
sits in its block ("quant_phase"), so every saved element can be dequantized alone.
Load: a shard of this run is assembled as its records come in (_Shard). A new block whose elements all come from
one saved block takes that block's codes and scale unchanged (exact: a resume on the same grid, which holds just the
codes, 1 byte an element); a block that mixes saved blocks (the grid moved: another world size, stage or bucketing)
is kept as fp32 values and re-quantized on the new grid once the shard is complete (one more rounding: at most 1/16
of the value, or below the smallest code half of that code; logged as a conversion).
Into a run with fp32 / 16-bit moments the dequantized values are written directly; fp32 / 16-bit moments loading
into an 8-bit run are quantized the same way (as blocks that moved).
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


class _Shard:
    """One 8-bit moment of one shard of this run, as its records come in. A new block whose elements all come from
    one saved block keeps that block's codes and scale as they are (exact); a block that mixes saved blocks (the
    grid moved) or takes float values is kept as fp32 values and quantized afresh at the end. The values are made
    only for the first such block, so a resume on the same grid holds the codes alone (1 byte an element)."""

    def __init__(self, n):
        blocks = q8.num_blocks(n)
        self.n = n
        self.codes = torch.zeros(blocks * QUANT_BLOCK, dtype=torch.uint8)   # padded to whole blocks
        self.scales = torch.zeros(blocks)
        self.source = torch.full((blocks,), -1, dtype=torch.int64)   # the saved block a block's codes come from
        self.mixed = torch.zeros(blocks, dtype=torch.bool)           # re-quantized from self.values
        self.values = None

    def _touched(self, lo, hi):
        blocks = torch.arange(lo // QUANT_BLOCK, (hi - 1) // QUANT_BLOCK + 1)
        return blocks, (blocks * QUANT_BLOCK).clamp(min=lo), ((blocks + 1) * QUANT_BLOCK).clamp(max=hi)

    def _mix(self, blocks, signed):
        """Mark blocks as re-quantized; those holding codes of one saved block so far turn them into values first."""
        fresh = blocks[~self.mixed[blocks]]
        if self.values is None:
            self.values = torch.zeros(self.codes.numel())
        held = fresh[self.source[fresh] >= 0]
        if held.numel():
            rows = self.codes.view(-1, QUANT_BLOCK)[held]
            self.values.view(-1, QUANT_BLOCK)[held] = \
                q8.dequantize(rows, self.scales[held], signed).view(-1, QUANT_BLOCK)
        self.mixed[fresh] = True

    def add_codes(self, lo, hi, codes, record_scales, first, source0, signed):
        """Saved codes for elements [lo, hi) of the shard; codes[0] sits at position `first` of its record's grid,
        whose block k has scale record_scales[k] and the source id source0 + k."""
        blocks, a, b = self._touched(lo, hi)
        src_a, src_b = (first + a - lo) // QUANT_BLOCK, (first + b - 1 - lo) // QUANT_BLOCK
        prior = self.source[blocks]
        whole = (src_a == src_b) & ((prior < 0) | (prior == source0 + src_a)) & ~self.mixed[blocks]
        if not bool(whole.all()):
            self._mix(blocks[~whole], signed)
        new = whole & (prior < 0)
        self.source[blocks[new]] = source0 + src_a[new]
        self.scales[blocks[new]] = record_scales[src_a[new]]
        self.codes[lo:hi] = codes
        if not bool(whole.all()):
            self.values[lo:hi] = q8.dequantize(codes, record_scales, signed, first)

    def add_values(self, lo, hi, values, signed):
        self._mix(self._touched(lo, hi)[0], signed)
        self.values[lo:hi] = values

    def finish(self, signed):
        """(codes, scales, whether any block was re-quantized)."""
        rows = self.mixed.nonzero().squeeze(1)
        step = 1 << 14   # blocks a chunk
        for i in range(0, rows.numel(), step):
            part = rows[i:i + step]
            codes, scales = q8.quantize(self.values.view(-1, QUANT_BLOCK)[part].reshape(-1), signed)
            self.codes.view(-1, QUANT_BLOCK)[part] = codes.view(-1, QUANT_BLOCK)
            self.scales[part] = scales
        codes = self.codes[:self.n]
        if codes.numel() != self.codes.numel():
            codes = codes.clone()   # a tensor of its own size: the NVMe swap and the state offload size by storage
        return codes, self.scales, rows.numel() > 0


class Loader:
    """Routes the moment keys of saved slices: dequantizes 8-bit ones into a float-state run, and assembles an 8-bit
    run's shards (_Shard) until their records are all read (flush)."""

    def __init__(self, optimizer, state_dtype):
        self.to_8bit = bool(getattr(optimizer, "states_8bit", False))
        self.state_dtype = state_dtype      # (param, saved dtype) -> the dtype a float state is kept in
        self.pending = {}                   # id(opt_param) -> (opt_param, state, {moment: _Shard})
        self.converted = set()
        self.saved_shards = {}              # (file, saved shard ordinal) -> a small int for the source ids

    def takes(self, key):
        return key in qs.CODE_KEYS or (self.to_8bit and key in qs.FLOAT_KEYS)

    def add(self, key, f, s, lo, hi, r, state, dst_lo, dst_hi):
        """The saved slice s's key for elements [lo, hi) of the parameter, into the record r's shard."""
        if key.endswith("_scales"):
            return                          # read with its codes
        shard = None
        if self.to_8bit:
            entry = self.pending.setdefault(id(r.opt_param), (r.opt_param, state, {}))
            moment = key[:-len("_codes")] if key.endswith("_codes") else key
            shard = entry[2].setdefault(moment, _Shard(r.opt_param.numel()))
        if key in qs.FLOAT_KEYS:
            values = f.get(s["keys"][key]).reshape(-1)[lo - s["start"]:hi - s["start"]]
            saved_kind, moment = str(values.dtype).replace("torch.", ""), key
            if shard is not None:
                shard.add_values(dst_lo, dst_hi, values.float(), _SIGNED[moment])
                self.converted.add((moment, saved_kind, "int8 (quantized)"))
                return
            values = values.float()
        else:
            moment = key[:-len("_codes")]
            if "quant_phase" not in s:
                raise CheckpointError(f"{f.path}: {s['keys'][key]!r} holds 8-bit codes but the manifest's slice has no "
                                      "quant_phase (where its elements sit on their block grid); the checkpoint is "
                                      "incomplete")
            codes = f.get(s["keys"][key]).reshape(-1)[lo - s["start"]:hi - s["start"]]
            scales = f.get(s["keys"][moment + "_scales"]).reshape(-1)
            first = lo - s["start"] + int(s["quant_phase"])   # codes[0]'s place on the record's grid
            if shard is not None:
                saved = self.saved_shards.setdefault((s["file"], s.get("quant_shard", 0)), len(self.saved_shards))
                shard.add_codes(dst_lo, dst_hi, codes, scales, first, (saved << 40) + int(s.get("quant_block0", 0)),
                                _SIGNED[moment])
                return
            values = q8.dequantize(codes, scales, _SIGNED[moment], first)
        dst = state.get(moment)
        if dst is None or dst.numel() != r.opt_param.numel():
            dst = state[moment] = torch.zeros(r.opt_param.shape, device=r.opt_param.device,
                                              dtype=self.state_dtype(r.opt_param, torch.float32))
        dst.view(-1)[dst_lo:dst_hi].copy_(values)
        self.converted.add((moment, "int8", str(dst.dtype).replace("torch.", "")))

    def flush(self, keep=None):
        """Finish every assembled shard except `keep` (the one whose records are still being read)."""
        for k in [k for k in self.pending if keep is None or k != id(keep)]:
            param, state, moments = self.pending.pop(k)
            for moment, shard in moments.items():
                codes, scales, moved = shard.finish(_SIGNED[moment])
                for suffix, value in (("_codes", codes), ("_scales", scales)):
                    old = state.get(moment + suffix)
                    if torch.is_tensor(old) and old.shape == value.shape and old.dtype == value.dtype:
                        old.copy_(value)    # in place: an NVMe swap keeps the state's tensor objects
                    else:
                        state[moment + suffix] = value
                state.pop(moment, None)
                if moved:
                    self.converted.add((moment, "int8", "int8 (re-quantized on this run's blocks)"))
