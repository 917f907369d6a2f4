"""Adam/AdamW with 8-bit block-wise moments: the code formats, one block's quantization error against float64, the native
op against its bit-exact pure-torch reference, the ISAs against each other, training against fp32 states, and the
state-dict conversions (dsfast.optim.CPUAdam8bit, dsfast.ops.reference.adam8bit)."""
import pytest
import torch

import dsfast.optim as O
from dsfast.ops.reference import adam8bit as Q
from _cpu_optim_helpers import native  # noqa: F401  (fixture)

SM, UM = Q.code_values(signed=True), Q.code_values(signed=False)


def test_code_formats_are_minifloats_with_zero_and_the_top_code():
    # magnitude code k >= 1: 2^((k >> 3) - e0) * (1 + (k & 7) / 8), exact in float64
    for table, e0, count in ((SM, 15, 128), (UM, 31, 256)):
        for k in range(1, count):
            assert table[k].item() == 2.0 ** ((k >> 3) - e0) * (1 + (k & 7) / 8), k
        assert table[0].item() == 0.0 and table[count - 1].item() == Q.CODE_TOP
    assert torch.equal(SM[128:], -SM[:128]) and (UM[1:] > UM[:-1]).all()
    # the unsigned format keeps small second moments: its smallest nonzero value is below 1e-9 of the top code
    assert 0 < UM[1].item() / Q.CODE_TOP < 1e-9


def _nearest64(x64, scale, table):
    """Float64 brute force: the distance from each x to the nearest table value times the scale."""
    return (x64[:, None] - table.double()[None, :] * scale).abs().min(dim=1).values


@pytest.mark.parametrize("signed", [True, False])
def test_one_block_quantization_error_against_float64(signed):
    torch.manual_seed(0)
    # one block of 256 values spanning twelve decades, as Adam's second moments do (and 5 exact zeros)
    x = torch.randn(256, dtype=torch.float64) * torch.logspace(-12, 0, 256, dtype=torch.float64)
    x[::50] = 0.0
    if not signed:
        x = x.abs()
    table = SM if signed else UM
    codes, scales = Q.quantize(x.float(), signed)
    back = Q.dequantize(codes, scales, signed).double()
    err, scale = (back - x).abs(), scales.double().item()
    assert scale == pytest.approx(x.abs().max().item() / Q.CODE_TOP, rel=1e-7)
    assert bool((back[x == 0] == 0).all())
    smallest = table[1].item() * scale
    # the computed code is the nearest one (ties either way), up to fp32 rounding of x, of |x| * (top / absmax)
    # and of the decoding multiply (3 * 2^-24 relative); except that a positive second moment below half the
    # smallest code rounds up to it
    up = (~torch.tensor(signed)) & (x > 0) & (x < smallest / 2)
    nearest = _nearest64(x, scale, table)
    assert torch.all(err[~up] <= nearest[~up] + 3 * 2.0 ** -24 * x.abs()[~up] + 1e-30)
    assert torch.all((back[up] - smallest).abs() <= 2.0 ** -23 * smallest)   # the decoding multiply's rounding
    # stated bound: 3 mantissa bits, so at most 1/16 of the value above the smallest code; below it, half that
    # code (signed) or the code itself (unsigned, rounded up)
    normal = x.abs() >= smallest
    assert torch.all(err[normal] <= x.abs()[normal] * (1 / 16 + 3 * 2.0 ** -24))
    assert torch.all(err[~normal] <= smallest * (0.5 if signed else 1.0) * (1 + 1e-6))


def test_a_tiny_second_moment_never_becomes_zero_and_the_step_stays_bounded():
    # one block: v spans 1 .. 1e-14 of its absmax (below the smallest code, 2^-31 * 1.125 / 1.875 ~ 2.8e-10),
    # m = sqrt(v) / 1000, as Adam's moments can be after a burst of large gradients in one corner of a block
    v = torch.logspace(0, -14, 256)
    m = v.sqrt() * 1e-3
    codes, scales = Q.quantize(v, signed=False)
    back = Q.dequantize(codes, scales, signed=False)
    assert bool((back > 0).all())
    # the step of the tiny-v elements: lr * m / (sqrt(v) + eps) with v rounded to 0 would be lr * m / eps = up to
    # 1e4 * lr; with v kept at the smallest code it is at most lr * 1e-3 * sqrt(v) / sqrt(v_code) < lr
    mb = Q.dequantize(*Q.quantize(m, signed=True), signed=True)
    lr, eps = 1e-3, 1e-8
    step = lr * mb / (back.sqrt() + eps)
    assert step.abs().max().item() < lr
    assert (lr * m / eps).max().item() > 1e3 * lr   # what a zero second moment would have done


def test_zero_block_and_short_last_block():
    codes, scales = Q.quantize(torch.zeros(300), True)
    assert scales.tolist() == [0.0, 0.0] and codes.numel() == 300 and int(codes.max()) == 0
    assert Q.dequantize(codes, scales, True).abs().max().item() == 0.0


@pytest.mark.parametrize("signed", [True, False])
def test_quantize_in_chunks_gives_the_whole_tensor_bits(signed, monkeypatch):
    """The reference quantizer works a bounded number of blocks at a time: chunks of 3 blocks (the last one short)
    give the codes and scales of one pass over the whole tensor."""
    y = torch.randn(100003, generator=torch.Generator().manual_seed(5)) * torch.logspace(-20, 5, 100003)
    y = y if signed else y.abs()
    whole = Q.quantize(y, signed)
    monkeypatch.setattr(Q, "_CHUNK_BLOCKS", 3)
    chunked = Q.quantize(y, signed)
    assert chunked[0].numel() == y.numel() and chunked[1].numel() == Q.num_blocks(y.numel())
    assert torch.equal(chunked[0], whole[0]) and torch.equal(chunked[1], whole[1])


@pytest.mark.parametrize("numel", [1, 256, 300, 4097])
def test_fresh_states_are_the_quantized_zeros(numel):
    # quant_state.empty_state writes zero codes and scales directly (the optimizer's first step creates one per
    # parameter); they must be what quantizing zeros gives, in the kernel's dtypes and layout
    from dsfast.optim import quant_state
    state = quant_state.empty_state(numel)
    for key, signed in (("exp_avg", True), ("exp_avg_sq", False)):
        codes, scales = Q.quantize(torch.zeros(numel), signed)
        got_codes, got_scales = state[key + "_codes"], state[key + "_scales"]
        assert got_codes.dtype == codes.dtype and got_scales.dtype == scales.dtype
        assert torch.equal(got_codes, codes) and torch.equal(got_scales, scales)
        assert got_codes.is_contiguous() and got_scales.is_contiguous()


def _lists(sizes, param_dtype=torch.float32, grad_dtype=torch.float32, out_dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(n, generator=g).to(param_dtype) for n in sizes]
    gs = [torch.randn(n, generator=g).to(grad_dtype) for n in sizes]
    mq = [Q.quantize(torch.randn(n, generator=g) * 0.01, True) for n in sizes]
    vq = [Q.quantize(torch.rand(n, generator=g) * 1e-4, False) for n in sizes]
    outs = [torch.zeros(n, dtype=out_dtype) for n in sizes] if out_dtype else []
    steps = [torch.tensor(float(k)) for k in range(len(sizes))]
    return [ps, gs, [c for c, _ in mq], [s for _, s in mq], [c for c, _ in vq], [s for _, s in vq], outs, steps]


def _run(fn, lists, steps=3, adamw=True, wd=0.01, betas=(0.9, 0.999), **kw):
    for _ in range(steps):
        fn(*lists, 1e-3, *betas, 1e-8, wd, adamw, True, **kw)
    return lists


CASES = [dict(), dict(out_dtype=torch.bfloat16), dict(grad_dtype=torch.bfloat16, adamw=False),
         dict(param_dtype=torch.bfloat16), dict(grad_dtype=torch.float16, out_dtype=torch.float16)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "fp32")
def test_native_scalar_body_computes_the_reference_bits(native, case):
    case = dict(case)
    adamw = case.pop("adamw", True)
    sizes = [1000, 256, 5, 0, 513]
    want = _run(Q.adam8bit_step, _lists(sizes, **case), adamw=adamw)
    got = _run(native.adam8bit_step, _lists(sizes, **case), adamw=adamw, isa="scalar")
    for name, a, b in zip(("params", "grads", "m codes", "m scales", "v codes", "v scales", "outs", "steps"),
                          got, want):
        for k, (x, y) in enumerate(zip(a, b)):
            assert torch.equal(x, y), f"{name}[{k}] differs from the reference"


def test_stochastic_rounding_of_bf16_params_matches_the_reference(native):
    sizes = [700]
    want = _run(Q.adam8bit_step, _lists(sizes, param_dtype=torch.bfloat16), round_seed=12345)
    got = _run(native.adam8bit_step, _lists(sizes, param_dtype=torch.bfloat16), round_seed=12345, isa="scalar")
    assert torch.equal(got[0][0], want[0][0])


@pytest.mark.parametrize("isa", ["avx2", "avx512", "avx512bf16"])
def test_vector_bodies_agree_with_the_scalar_body(native, isa):
    if isa not in native.available_isas():
        pytest.skip(f"{isa} not supported by this CPU")
    # whole blocks each encoded during the next one's update (kernel_8bit.h PendingEncode): a tensor ending on a
    # short block, on a whole block, and a single block
    sizes = [5000, 300, 7, 512, 256]
    ref = _run(native.adam8bit_step, _lists(sizes, out_dtype=torch.bfloat16), steps=5, isa="scalar")
    got = _run(native.adam8bit_step, _lists(sizes, out_dtype=torch.bfloat16), steps=5, isa=isa)
    # the vector bodies fuse multiply-adds: a param ulp apart, so a requantized code may land on the neighbour
    for a, b in zip(got[0], ref[0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)
    for codes in (2, 4):
        for a, b in zip(got[codes], ref[codes]):
            diff = (a.int() - b.int()).abs()
            assert diff.max().item() <= 1 and diff.float().mean().item() < 0.01
    for scales in (3, 5):
        for a, b in zip(got[scales], ref[scales]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("isa", ["avx2", "avx512", "avx512bf16"])
def test_vector_encoding_is_bit_identical_to_the_scalar_body(native, isa):
    if isa not in native.available_isas():
        pytest.skip(f"{isa} not supported by this CPU")
    # betas 0: the new moments are g and g * g exactly on every ISA, so the codes and scales must be identical
    sizes = [5000, 300, 7, 512, 256]
    ref = _run(native.adam8bit_step, _lists(sizes), steps=1, betas=(0.0, 0.0), isa="scalar")
    got = _run(native.adam8bit_step, _lists(sizes), steps=1, betas=(0.0, 0.0), isa=isa)
    for k in (2, 3, 4, 5):
        for a, b in zip(got[k], ref[k]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "avx512bf16"])
def test_every_code_decodes_and_reencodes_to_itself_on_every_isa(native, isa):
    if isa not in native.available_isas():
        pytest.skip(f"{isa} not supported by this CPU")
    # betas 1: the new moments are the decoded ones exactly (m + 0 * (g - m), 1 * v + 0 * g * g), so each code must
    # come back unchanged (but 128, exp_avg's -0, as 0) and each scale too: a decode that got any code's sign, bias
    # or zero wrong changes them.
    # Every code 0..255 in each block (code 127 / 255, the top, sets the absmax), blocks scaled 2^-40 .. 2^20.
    n = 256 * 8 + 100
    codes = torch.arange(n, dtype=torch.int32).remainder(256)
    m_codes, v_codes = codes.to(torch.uint8), codes.flip(0).to(torch.uint8)
    v_codes[-100:] = 255   # the short last block needs its own top code
    m_codes[-100:][0] = 127
    scales = torch.tensor([2.0 ** e for e in range(-40, 21, 7)][:Q.num_blocks(n)])
    lists = [[torch.randn(n)], [torch.randn(n)], [m_codes.clone()], [scales.clone()], [v_codes.clone()],
             [scales.clone() * 3], [], [torch.tensor(0.0)]]
    native.adam8bit_step(*lists, 1e-3, 1.0, 1.0, 1e-8, 0.0, True, False, isa=isa)
    m_want = torch.where(m_codes == 128, 0, m_codes)
    for got, want in ((lists[2][0], m_want), (lists[3][0], scales), (lists[4][0], v_codes), (lists[5][0], scales * 3)):
        assert torch.equal(got, want)


def _extreme_lists():
    """One tensor of 8 blocks from zero states: plain; +inf, -inf and NaN gradients (absmax inf / NaN); denormal
    gradients and zeros (kCodeTop / absmax overflows); g * g overflowing (v's absmax inf, m's finite); g * g
    underflowing; zeros. Params span 1e-30 .. 1e30. In the first block, among gradients of ~1, one of 1e-21 (with
    betas 0, v = 1e-42 / absmax ~ 1e-43, below 2^-133: a denormal product whose high 16 bits are 0, which must still
    get code 1, never 0)."""
    B = Q.QUANT_BLOCK
    g = torch.Generator().manual_seed(3)
    grads = torch.randn(8 * B, generator=g)
    grads[17] = 1e-21
    grads[B + 5], grads[2 * B + 7], grads[3 * B + 9] = float("inf"), -float("inf"), float("nan")
    grads[4 * B:5 * B] = torch.randn(B, generator=g) * 1e-40
    grads[4 * B:5 * B:3] = 0.0
    grads[5 * B:6 * B] *= 1e25
    grads[6 * B:7 * B] *= 1e-20
    grads[7 * B:] = 0.0
    n = grads.numel()
    params = torch.randn(n, generator=g) * torch.logspace(-30, 30, n)
    blocks = Q.num_blocks(n)
    return [[params], [grads], [torch.zeros(n, dtype=torch.uint8)], [torch.zeros(blocks)],
            [torch.zeros(n, dtype=torch.uint8)], [torch.zeros(blocks)], [torch.zeros(n, dtype=torch.bfloat16)],
            [torch.tensor(0.0)]]


@pytest.mark.parametrize("betas", [(0.0, 0.0), (0.9, 0.999)])
@pytest.mark.parametrize("isa", ["scalar", "avx2", "avx512", "avx512bf16"])
def test_extreme_inputs_codes_equal_the_reference_and_params_within_the_fma_tolerance(native, isa, betas):
    if isa not in native.available_isas():
        pytest.skip(f"{isa} not supported by this CPU")
    want = _extreme_lists()
    p0 = want[0][0].clone()
    Q.adam8bit_step(*want, 1e-3, *betas, 1e-8, 0.1, True, True)
    got = _extreme_lists()
    native.adam8bit_step(*got, 1e-3, *betas, 1e-8, 0.1, True, True, isa=isa)
    # from zero states the moments are computed alike on every ISA, so codes and scales are the reference's bits,
    # in the blocks with infinities, NaNs and tiny absmaxes too
    for k in (2, 3, 4, 5):
        a, b = got[k][0], want[k][0]
        assert torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                           b.view(torch.int32) if b.is_floating_point() else b), k
    a, b = got[0][0], want[0][0]
    assert torch.equal(a.isnan(), b.isnan()) and torch.equal(got[6][0].isnan(), want[6][0].isnan())
    finite = ~b.isnan()
    if isa == "scalar":   # the scalar body rounds every fp32 op as the reference does (NaN payloads aside)
        assert torch.equal(a[finite], b[finite]) and torch.equal(got[6][0][finite], want[6][0][finite])
        return
    # Stated tolerance: the vector bodies contract multiply-adds into FMAs (one rounding where the scalar body and
    # the reference round twice: the moments' multiply-adds, the denominator's, p * (1 - lr * wd) - update), each
    # moving the update or the result by up to half an ulp: within 4 * 2^-24 of |p0| + |p1| (measured: 2.8, i.e. up
    # to 2 ulps of a result the update dominates; 1 ulp where the moments start at zero and betas are 0)
    tol = 2.0 ** -22 * (p0.abs() + b.abs())
    assert bool(((a - b).abs()[finite] <= tol[finite]).all())


@pytest.mark.parametrize("isa", ["avx2", "avx512", "avx512bf16"])
def test_outputs_streamed_when_aligned_and_copied_when_not_are_the_same(native, isa):
    if isa not in native.available_isas():
        pytest.skip(f"{isa} not supported by this CPU")
    # the vector bodies write a block's 16-bit outputs with non-temporal stores where the output is aligned to the
    # vector, else with a plain copy: both must give the output the aligned run gives, and the same params
    sizes = [5000, 300]
    aligned = _run(native.adam8bit_step, _lists(sizes, out_dtype=torch.bfloat16), steps=2, isa=isa)
    shifted = _lists(sizes, out_dtype=torch.bfloat16)
    backing = [torch.zeros(n + 1, dtype=torch.bfloat16) for n in sizes]
    shifted[6] = [b[1:] for b in backing]   # 2 bytes past an aligned allocation
    assert all(o.data_ptr() % 32 == 2 for o in shifted[6])
    _run(native.adam8bit_step, shifted, steps=2, isa=isa)
    for k in (0, 2, 3, 4, 5, 6):
        for a, b in zip(shifted[k], aligned[k]):
            assert torch.equal(a, b), k
    assert all(bool((o != 0).all()) for o in aligned[6])


def test_threads_split_on_block_boundaries(native):
    # 3 x 100k elements: up to 9 threads; chunk boundaries must fall on 256-element blocks (bits equal to 1 thread)
    sizes = [100_000, 99_999, 70_001]
    one = _run(native.adam8bit_step, _lists(sizes), steps=2, num_threads=1)
    many = _run(native.adam8bit_step, _lists(sizes), steps=2, num_threads=8)
    for a, b in zip(one, many):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_native_refuses_bad_inputs(native):
    lists = _lists([300])
    lists[3] = [torch.zeros(1)]   # 300 elements need 2 scales
    with pytest.raises(ValueError, match="exp_avg_scales.*2 elements"):
        native.adam8bit_step(*lists, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    lists = _lists([300], param_dtype=torch.float16)
    with pytest.raises(TypeError, match="float16"):
        native.adam8bit_step(*lists, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    lists = _lists([300], param_dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="own 16-bit copy"):
        native.adam8bit_step(*lists, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)


def _train(cls, steps=100, seed=0, **kw):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = cls(model.parameters(), lr=1e-2, weight_decay=0.01, **kw)
    x = torch.randn(256, 16)
    y = torch.sin(x.sum(1, keepdim=True))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model, opt


def test_training_with_8bit_states_tracks_fp32_states():
    fp32, _, _ = _train(O.CPUAdam)
    q8, _, _ = _train(O.CPUAdam8bit)
    assert q8[-1] < 0.1 * q8[0]
    # stated tolerance: within 10% of the fp32 run's loss at every 10th step of the first 60 (the curves then
    # reach 1e-3 and below, where either run's noise dominates), and the final loss within a factor 3
    for k in range(0, 60, 10):
        assert abs(q8[k] - fp32[k]) <= 0.1 * fp32[k], (k, q8[k], fp32[k])
    assert q8[-1] <= 3 * fp32[-1] + 1e-4


def test_state_dict_round_trip_continues_bit_for_bit():
    _, model, opt = _train(O.CPUAdam8bit, steps=5)
    sd = opt.state_dict()
    assert set(sd["state"][0]) == {"step", "exp_avg_codes", "exp_avg_scales", "exp_avg_sq_codes",
                                   "exp_avg_sq_scales"}
    assert sd["state"][0]["exp_avg_codes"].dtype == torch.uint8
    assert sd["state"][0]["exp_avg_scales"].numel() == Q.num_blocks(model[0].weight.numel())
    clone = O.CPUAdam8bit(model.parameters(), lr=1e-2, weight_decay=0.01)
    clone.load_state_dict(sd)
    for p in model.parameters():
        for k in ("exp_avg_codes", "exp_avg_scales", "exp_avg_sq_codes", "exp_avg_sq_scales", "step"):
            assert torch.equal(opt.state[p][k], clone.state[p][k])


def test_state_dict_conversions_fp32_to_8bit_and_back_log_and_keep_values(capsys):
    _, model, fp32 = _train(O.CPUAdam, steps=5)
    sd32 = fp32.state_dict()
    q8 = O.CPUAdam8bit(model.parameters())
    q8.load_state_dict(sd32)
    assert "quantized the float exp_avg / exp_avg_sq of 4 parameter(s)" in capsys.readouterr().out
    back = O.CPUAdam(model.parameters())
    back.load_state_dict(q8.state_dict())
    assert "dequantized the 8-bit block-wise exp_avg / exp_avg_sq of 4 parameter(s)" in capsys.readouterr().out
    for i, p in enumerate(model.parameters()):
        for key, table in (("exp_avg", SM), ("exp_avg_sq", UM)):
            a, b = back.state[p][key], sd32["state"][i][key]
            assert a.shape == p.shape and a.dtype == torch.float32
            # 3 mantissa bits: 1/16 of the value, or below the smallest code at most that code (of the block's
            # scale, absmax / CODE_TOP <= the tensor's absmax / CODE_TOP)
            floor = table[1].item() * b.abs().max().item() / Q.CODE_TOP
            assert bool(((a - b).abs() <= (b.abs() / 16 + floor) * (1 + 1e-5)).all()), key


def test_optimizer_refuses_fp16_params_and_bad_codes():
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        O.CPUAdam8bit([torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))])
    p = torch.nn.Parameter(torch.zeros(4, 4))
    p.grad = torch.ones(4, 4).t()
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\] or its gradient is not contiguous"):
        O.CPUAdam8bit([p]).step()
    _, model, opt = _train(O.CPUAdam8bit, steps=1)
    sd = opt.state_dict()
    sd["state"][0]["exp_avg_codes"] = sd["state"][0]["exp_avg_codes"][:-1]
    with pytest.raises(ValueError, match="exp_avg_codes.*must hold"):
        O.CPUAdam8bit(model.parameters()).load_state_dict(sd)


def test_bf16_params_train_with_8bit_states():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(1000, dtype=torch.bfloat16))
    opt = O.CPUAdamW8bit([p], lr=1e-2)
    start = p.detach().float().pow(2).sum().item()
    for _ in range(50):
        opt.zero_grad()
        p.float().pow(2).sum().backward()
        opt.step()
    assert p.dtype == torch.bfloat16 and p.detach().float().pow(2).sum().item() < 0.5 * start


def test_reference_and_fake_refuse_what_the_native_op_refuses():
    from torch._subclasses.fake_tensor import FakeTensorMode
    lists = _lists([300])
    lists[3] = [torch.zeros(1)]
    with pytest.raises(ValueError, match=r"params\[0\] state\['exp_avg_scales'\].*2 elements"):
        Q.adam8bit_step(*lists, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    with pytest.raises(TypeError, match="float16"):
        Q.adam8bit_step(*_lists([300], param_dtype=torch.float16), 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
    from dsfast.ops import loaded_from, load
    if loaded_from("cpu_optim") == "reference":
        return
    load("cpu_optim")
    real = _lists([300])
    with FakeTensorMode() as mode:
        fake = [[mode.from_tensor(t) for t in seq] for seq in real]
        fake[2] = [torch.zeros(5, dtype=torch.uint8)]
        with pytest.raises(ValueError, match="exp_avg_codes"):
            torch.ops.dsfast.cpu_adam8bit_step(*fake, 1e-3, 0.9, 0.999, 1e-8, 0.0, True, True)
