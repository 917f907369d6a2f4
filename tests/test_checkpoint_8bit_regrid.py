"""Loading 8-bit moments onto another block grid (checkpoint/quant_slices.py's _Shard), against a per-element
reference: every new block whose elements all come from one saved block keeps that block's codes and scale bit for
bit; every other block is the reference quantizer's codes of the dequantized values on the new grid. And a resume on
the same grid never makes the fp32 values (1 byte an element, not 5)."""
import random

import pytest
import torch

from dsfast.checkpoint.quant_slices import _Shard
from dsfast.ops.reference import adam8bit as Q

B = Q.QUANT_BLOCK


def _saved_ranks(sizes, signed, seed):
    """Saved shards (one per rank), each quantized on its own grid: [(codes, scales)]."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        x = torch.randn(n, generator=g) * torch.logspace(-6, 0, n)[torch.randperm(n, generator=g)]
        out.append(Q.quantize(x if signed else x.abs(), signed))
    return out


def _cuts(lo, hi, rng, count):
    """[lo, hi) split at `count` random points: the records."""
    points = sorted({lo, hi, *(rng.randrange(lo, hi) for _ in range(count))})
    return list(zip(points, points[1:]))


def _load(saved, saved_records, new_lo, new_hi, new_records, signed):
    """The new shard [new_lo, new_hi) of the global element order, its records fed to _Shard piece by piece, each
    piece from the saved records it overlaps (as shards.apply feeds the loader)."""
    shard = _Shard(new_hi - new_lo)
    bases = [0]
    for codes, _ in saved:
        bases.append(bases[-1] + codes.numel())
    for a, b in new_records:
        for rank, (codes, scales) in enumerate(saved):
            for ra, rb in saved_records[rank]:            # rank-local record [ra, rb)
                lo, hi = max(a, bases[rank] + ra), min(b, bases[rank] + rb)
                if lo >= hi:
                    continue
                first_block = ra // B
                record_scales = scales[first_block:(rb - 1) // B + 1]
                piece = codes[lo - bases[rank]:hi - bases[rank]]
                first = lo - bases[rank] - first_block * B    # piece[0] on the record's grid
                shard.add_codes(lo - new_lo, hi - new_lo, piece, record_scales, first,
                                (rank << 40) + first_block, signed)
    return shard


def _reference(saved, new_lo, new_hi, signed):
    """Per element: its value and its saved block; a new block keeps its codes where all its elements share one."""
    values = torch.cat([Q.dequantize(c, s, signed) for c, s in saved])[new_lo:new_hi]
    codes = torch.cat([c for c, _ in saved])[new_lo:new_hi]
    source = torch.cat([(r << 40) + torch.arange(c.numel()) // B for r, (c, _) in enumerate(saved)])[new_lo:new_hi]
    scale_of = torch.cat([s.repeat_interleave(B)[:c.numel()] for c, s in saved])[new_lo:new_hi]
    want_codes, want_scales = Q.quantize(values, signed)
    moved = False
    for j in range(want_scales.numel()):
        part = slice(j * B, min((j + 1) * B, values.numel()))
        if bool((source[part] == source[part][0]).all()):
            want_codes[part] = codes[part]
            want_scales[j] = scale_of[part][0]
        else:
            moved = True
    return want_codes, want_scales, moved


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_regrid_matches_the_per_element_reference(signed, seed):
    rng = random.Random(seed)
    sizes = [rng.randrange(1, 5 * B) for _ in range(rng.randrange(1, 4))]
    saved = _saved_ranks(sizes, signed, seed)
    saved_records = [_cuts(0, n, rng, rng.randrange(0, 4)) for n in sizes]
    total = sum(sizes)
    new_lo = rng.choice([0, rng.randrange(0, total)])
    new_hi = rng.randrange(new_lo + 1, total + 1)
    new_records = _cuts(new_lo, new_hi, rng, rng.randrange(0, 4))
    shard = _load(saved, saved_records, new_lo, new_hi, new_records, signed)
    codes, scales, moved = shard.finish(signed)
    want_codes, want_scales, want_moved = _reference(saved, new_lo, new_hi, signed)
    assert torch.equal(codes, want_codes)
    assert torch.equal(scales, want_scales)
    assert moved == want_moved


@pytest.mark.parametrize("signed", [True, False])
def test_same_grid_keeps_codes_and_makes_no_values(signed):
    """One saved shard split into records at unaligned points, loaded whole on the same grid: exact, and the shard
    never held fp32 values."""
    n = 7 * B + 31
    saved = _saved_ranks([n], signed, 0)
    records = [(0, 100), (100, 3 * B + 5), (3 * B + 5, n)]
    shard = _load(saved, [records], 0, n, records, signed)
    assert shard.values is None
    codes, scales, moved = shard.finish(signed)
    assert torch.equal(codes, saved[0][0]) and torch.equal(scales, saved[0][1]) and not moved


def test_a_block_moved_after_its_first_piece_takes_that_piece_as_values():
    """A new block first filled from one saved block (codes kept), then given elements of another saved block:
    its first piece must be re-quantized too, from the codes already taken (their values)."""
    saved = _saved_ranks([B + 10, B], True, 3)
    # new shard = saved rank 0's elements [B, B + 10) then rank 1's [0, 246): one block from two saved blocks,
    # fed as two records in that order
    shard = _load(saved, [[(0, B + 10)], [(0, B)]], B, 2 * B, [(B, B + 10), (B + 10, 2 * B)], True)
    codes, scales, moved = shard.finish(True)
    want_codes, want_scales, _ = _reference(saved, B, 2 * B, True)
    assert moved and torch.equal(codes, want_codes) and torch.equal(scales, want_scales)


@pytest.mark.parametrize("signed", [True, False])
def test_quantized_moment_reads_and_writes_ranges(signed):
    """quant_state.QuantizedMoment (the ZeRO owners' getters and setters of 8-bit moments): a read is the whole
    dequantization's slice; a write leaves every block it does not touch bit for bit, and the blocks it touches are
    the reference quantizer's codes of the old values with the range replaced."""
    from dsfast.optim.quant_state import QuantizedMoment
    key = "exp_avg" if signed else "exp_avg_sq"
    n = 5 * B + 17
    x = torch.randn(n, generator=torch.Generator().manual_seed(1)) * 1e-3
    x = x if signed else x.abs()
    codes, scales = Q.quantize(x, signed)
    state = {key + "_codes": codes.clone(), key + "_scales": scales.clone()}
    moment = QuantizedMoment(state, key)
    whole = Q.dequantize(codes, scales, signed)
    assert torch.equal(moment[B + 3:3 * B + 9], whole[B + 3:3 * B + 9]) and moment[7:7].numel() == 0
    new = torch.full((2 * B,), 5e-3 if signed else 2e-7)
    moment[B + 3:3 * B + 3] = new
    want_values = whole.clone()
    want_values[B + 3:3 * B + 3] = new
    want_codes, want_scales = Q.quantize(want_values[B:4 * B], signed)   # blocks 1-3: those touched
    got_codes, got_scales = state[key + "_codes"], state[key + "_scales"]
    assert torch.equal(got_codes[:B], codes[:B]) and torch.equal(got_codes[4 * B:], codes[4 * B:])
    assert torch.equal(got_scales[[0, 4, 5]], scales[[0, 4, 5]])
    assert torch.equal(got_codes[B:4 * B], want_codes) and torch.equal(got_scales[1:4], want_scales)
    with pytest.raises(ValueError, match="contiguous ranges"):
        moment[0:10:2]
