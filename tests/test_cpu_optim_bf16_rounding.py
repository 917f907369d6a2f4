"""The bf16 copy every body writes (16-bit outputs, bf16 masters and states) is fp32 rounded to nearest even, a NaN
quieted with its sign and payload kept. The AVX512BF16 body rounds with one instruction (vcvtneps2bf16), which
flushes a denormal to zero, so it takes the integer path for a vector holding one. Here every class of fp32 value,
in every lane of a vector, goes through each body with lr = 0 (the param comes back unchanged): the bf16 copy must
be the same bits on every ISA, and torch's rounding wherever the value is not a NaN."""
import pytest
import torch

from _cpu_optim_helpers import native  # noqa: F401  (fixture)

# fp32 bit patterns: zeros, denormals (the smallest; ties at their 16th bit; the largest, which rounds up to the
# smallest normal), ties to even down and up, the largest finite (rounds to inf), infinities, NaNs (signalling,
# negative, with a payload)
SPECIAL = [0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x0000FFFF, 0x007F8000,
           0x007FFFFF, 0x807FFFFF, 0x00800000, 0x3F808000, 0x3F818000, 0xBF818000, 0x7F7FFFFF, 0xFF7FFFFF,
           0x7F800000, 0xFF800000, 0x7F800001, 0xFFC00000, 0x7FC12345, 0x3F800001]


def _params():
    """The special values at every lane offset (alone among normal values, and side by side), then random bits."""
    g = torch.Generator().manual_seed(11)
    normal = torch.randn(16 * 2 * len(SPECIAL), generator=g)
    bits = normal.view(torch.int32).clone()
    for k, s in enumerate(SPECIAL):
        signed = s - (1 << 32) if s >= 1 << 31 else s
        bits[32 * k + k % 16] = signed                 # one special lane in a vector of normal values
        bits[32 * k + 16:32 * k + 32] = signed         # a whole vector of it
    random_bits = torch.randint(-(1 << 31), 1 << 31, (4096,), generator=g, dtype=torch.int64).to(torch.int32)
    return torch.cat([bits, random_bits]).view(torch.float32)


def _bf16_copy(op, isa, adam8bit):
    p = _params()
    n = p.numel()
    g = torch.zeros(n)
    out = torch.zeros(n, dtype=torch.bfloat16)
    if adam8bit:
        blocks = (n + 255) // 256
        op.adam8bit_step([p], [g], [torch.zeros(n, dtype=torch.uint8)], [torch.zeros(blocks)],
                         [torch.zeros(n, dtype=torch.uint8)], [torch.zeros(blocks)], [out], [torch.tensor(0.0)],
                         0.0, 0.9, 0.999, 1e-8, 0.0, False, True, isa=isa)
    else:
        op.adam_step([p], [g], [torch.zeros(n)], [torch.zeros(n)], [out], [torch.tensor(0.0)], 0.0, 0.9, 0.999,
                     1e-8, 0.0, False, True, isa=isa)
    return p, out


@pytest.mark.parametrize("adam8bit", [False, True], ids=["adam", "adam8bit"])
@pytest.mark.parametrize("isa", ["avx2", "avx512", "avx512bf16"])
def test_bf16_copies_are_the_same_bits_on_every_isa(native, isa, adam8bit):
    if isa not in native.available_isas():
        pytest.skip(f"{isa} not supported by this CPU")
    p, got = _bf16_copy(native, isa, adam8bit)
    p_ref, want = _bf16_copy(native, "scalar", adam8bit)
    assert torch.equal(p.view(torch.int32), p_ref.view(torch.int32)), "lr = 0 must leave the params as they were"
    bad = (got.view(torch.int16) != want.view(torch.int16)).nonzero().flatten()
    assert bad.numel() == 0, [(hex(p.view(torch.int32)[i].item() & 0xFFFFFFFF), hex(got.view(torch.int16)[i].item()
                                & 0xFFFF), hex(want.view(torch.int16)[i].item() & 0xFFFF)) for i in bad[:8]]


def test_the_scalar_body_rounds_as_torch_does(native):
    p, got = _bf16_copy(native, "scalar", adam8bit=False)
    finite_or_inf = ~p.isnan()
    assert torch.equal(got[finite_or_inf].view(torch.int16), p[finite_or_inf].to(torch.bfloat16).view(torch.int16))
    assert bool(got[~finite_or_inf].isnan().all())
