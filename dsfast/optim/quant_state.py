"""Adam moments as 8-bit block-wise codes and scales (dsfast.ops.reference.adam8bit's layout), and the explicit
conversions between that and fp32 / 16-bit moments, for state dicts and checkpoints."""
import torch

from ..ops.reference import adam8bit as _q

QUANT_BLOCK = _q.QUANT_BLOCK
CODE_KEYS = ("exp_avg_codes", "exp_avg_scales", "exp_avg_sq_codes", "exp_avg_sq_scales")
FLOAT_KEYS = ("exp_avg", "exp_avg_sq")
_MOMENTS = (("exp_avg", True), ("exp_avg_sq", False))   # (key, signed code format)


def bytes_per_element(numel):
    """Host bytes of both 8-bit moments of a tensor of numel elements: 2 codes + 2 fp32 scales per block."""
    return 2 * numel + 2 * 4 * _q.num_blocks(numel)


def empty_state(numel):
    """Zero moments of numel elements: every code 0, every scale 0 (what quantizing zeros gives, written directly:
    the reference quantizer took 10 s on 250M elements, the whole first step)."""
    state = {}
    for key, _ in _MOMENTS:
        state[key + "_codes"] = torch.zeros(numel, dtype=torch.uint8)
        state[key + "_scales"] = torch.zeros(_q.num_blocks(numel), dtype=torch.float32)
    return state


def is_quantized(state):
    return isinstance(state, dict) and "exp_avg_codes" in state


def quantize_moments(moments, numel, where):
    """{exp_avg_codes, ...} from a dict holding float exp_avg and exp_avg_sq of numel elements."""
    out = {}
    for key, signed in _MOMENTS:
        t = moments.get(key)
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() != numel:
            raise ValueError(f"{where}: state[{key!r}] must be a float tensor of {numel} elements to be quantized, "
                             f"got {type(t).__name__ if not isinstance(t, torch.Tensor) else (t.dtype, t.numel())}")
        out[key + "_codes"], out[key + "_scales"] = _q.quantize(t.detach().cpu(), signed)
    return out


def check_codes(state, numel, where):
    """The 8-bit moments of a state dict entry in the kernel's layout (uint8 codes, fp32 scales, contiguous cpu)."""
    out = {}
    blocks = _q.num_blocks(numel)
    for key in CODE_KEYS:
        t = state.get(key)
        want = numel if key.endswith("codes") else blocks
        if not isinstance(t, torch.Tensor) or t.numel() != want:
            raise ValueError(f"{where}: state[{key!r}] must hold {want} elements for a parameter of {numel} "
                             f"(block size {QUANT_BLOCK}), got {t.numel() if isinstance(t, torch.Tensor) else t!r}")
        dtype = torch.uint8 if key.endswith("codes") else torch.float32
        if key.endswith("codes") and t.dtype != torch.uint8:
            raise TypeError(f"{where}: state[{key!r}] has dtype {t.dtype}; 8-bit codes are torch.uint8")
        out[key] = t.detach().to(device="cpu", dtype=dtype, copy=True).reshape(-1).contiguous()
    return out


def dequantize_moments(state, dtype=torch.float32):
    """{exp_avg, exp_avg_sq} (flat, `dtype`) from the 8-bit moments of a state."""
    return {key: _q.dequantize(state[key + "_codes"], state[key + "_scales"], signed).to(dtype)
            for key, signed in _MOMENTS}


class QuantizedMoment:
    """One 8-bit moment of a state, read and written as fp32 values by element range (the ZeRO owners' getters and
    setters: safe_get / safe_set_full_optimizer_state). Only the blocks a range touches are dequantized; a write
    quantizes those blocks again, so their other elements (a neighbouring parameter sharing a block) are rounded
    once more, by at most half a code step."""

    def __init__(self, state, key):
        self.codes, self.scales = state[key + "_codes"], state[key + "_scales"]
        self.signed = dict(_MOMENTS)[key]

    def _blocks(self, index):
        start, stop, step = index.indices(self.codes.numel())
        if step != 1:
            raise ValueError("an 8-bit moment is read and written by contiguous ranges")
        b0, b1 = start // QUANT_BLOCK, _q.num_blocks(stop) if stop > start else start // QUANT_BLOCK
        return start, stop, b0, b1

    def _values(self, b0, b1):
        lo, hi = b0 * QUANT_BLOCK, min(b1 * QUANT_BLOCK, self.codes.numel())
        return _q.dequantize(self.codes[lo:hi], self.scales[b0:b1], self.signed)

    def __getitem__(self, index):
        start, stop, b0, b1 = self._blocks(index)
        return self._values(b0, b1)[start - b0 * QUANT_BLOCK:stop - b0 * QUANT_BLOCK]

    def __setitem__(self, index, values):
        start, stop, b0, b1 = self._blocks(index)
        if stop <= start:
            return
        blocks = self._values(b0, b1)
        blocks[start - b0 * QUANT_BLOCK:stop - b0 * QUANT_BLOCK] = values
        codes, scales = _q.quantize(blocks, self.signed)
        self.codes[b0 * QUANT_BLOCK:b0 * QUANT_BLOCK + codes.numel()] = codes   # in place: the NVMe swap's tensors
        self.scales[b0:b1] = scales


def dequantize_into(state, original, param, dtype, where):
    """If the saved entry `original` holds 8-bit moments, put them into `state` (an fp32 / 16-bit state optimizer's)
    as exp_avg / exp_avg_sq of param's shape and `dtype`, drop the code keys, and return 1; else return 0."""
    if not state or not is_quantized(original):
        return 0
    moments = dequantize_moments(check_codes(original, param.numel(), where), dtype)
    for key in CODE_KEYS:
        state.pop(key, None)
    for key, t in moments.items():
        state[key] = t.view(param.shape).contiguous()
    return 1
