"""CPUAdam8bit's work-table fast path (cpu_adam8bit_table_fill_ / cpu_adam8bit_table_, as CPUAdam's): bit-identical
to the list op, rebuilt when a tensor moves (the scales too, whose size is the block count), nothing written by a
stale table, the list op's errors naming the parameter, and opcheck of both ops."""
import pytest
import torch

import dsfast.optim as O
from dsfast.optim import _cpu_op, quant_state
from _cpu_optim_helpers import list_op_then_tables, native  # noqa: F401  (native: a fixture)

SHAPES = [(37,), (5, 70), (1,), (300,), (2, 256)]   # whole blocks, a short last block, a one-element one
HP = (1e-2, 0.9, 0.999, 1e-8, 0.01, True, True)


@pytest.fixture
def table_calls(native, monkeypatch):
    """How many 8-bit table steps ran, and how many the op refused (a tensor had moved)."""
    calls = {"ran": 0, "stale": 0}
    real = native.adam8bit_table_step

    def counted(*a, **k):
        ran = real(*a, **k)
        calls["ran" if ran else "stale"] += 1
        return ran
    monkeypatch.setattr(native, "adam8bit_table_step", counted)
    return calls


def _params(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]


def _grads(step):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g) * 1e-2 for s in SHAPES]


def _run(kw, steps, tables, monkeypatch, fresh, dtype=torch.float32, halves=None):
    with monkeypatch.context() as m:
        if not tables:
            m.setattr(_cpu_op, "tables_usable", lambda: False)
        ps = _params(dtype)
        opt = O.CPUAdam8bit(ps, lr=1e-2, **kw)
        outs = [[torch.zeros(s, dtype=d) for s, d in zip(SHAPES, halves)]] if halves else None
        for k in range(steps):
            for p, g in zip(ps, _grads(k)):
                if fresh or p.grad is None:
                    p.grad = g.to(dtype)
                else:
                    p.grad.copy_(g)
            opt.step(fp16_param_groups=outs) if outs else opt.step()
        return ps, opt, outs


@pytest.mark.parametrize("fresh", [False, True], ids=["same-grads", "new-grads"])
@pytest.mark.parametrize("dtype,halves", [(torch.float32, None),
                                          (torch.float32, (torch.bfloat16, torch.float16) * 2 + (torch.bfloat16,)),
                                          (torch.bfloat16, None)])
@pytest.mark.parametrize("kw", [dict(weight_decay=0.01), dict(adamw_mode=False, weight_decay=0.1),
                                dict(bias_correction=False, maximize=True)])
def test_table_path_is_bit_identical_to_the_list_op(native, table_calls, monkeypatch, kw, dtype, halves, fresh):
    want, want_opt, want_outs = _run(kw, 4, False, monkeypatch, fresh, dtype, halves)
    assert table_calls["ran"] == 0
    got, opt, outs = _run(kw, 4, True, monkeypatch, fresh, dtype, halves)
    assert table_calls == {"ran": 3, "stale": 0}   # step 1 makes the states (list op), then the table
    for p, q in zip(got, want):
        assert torch.equal(p, q)
        for key in ("step",) + quant_state.CODE_KEYS:
            assert torch.equal(opt.state[p][key], want_opt.state[q][key]), key
    for a, b in zip(outs[0] if outs else [], want_outs[0] if want_outs else []):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def _cached():
    ps = _params()
    opt = O.CPUAdam8bit(ps, lr=1e-2)
    for k in range(2):
        for p, g in zip(ps, _grads(k)):
            p.grad = g
        opt.step()
    return ps, opt


@pytest.mark.parametrize("key", ["exp_avg_codes", "exp_avg_sq_scales"])
def test_repointed_tensors_are_picked_up(native, table_calls, monkeypatch, key):
    """p.data = new (as ZeRO does) and a state tensor's .data re-pointed between steps: the table is rebuilt, the
    old memory never written, the result the list op's."""
    results = []
    for _ in list_op_then_tables(monkeypatch):
        ps, opt = _cached()
        old_p, state = ps[1].data, opt.state[ps[3]][key]
        before_p, old_state_mem = old_p.clone(), state.data
        before_state = old_state_mem.clone()
        ps[1].data = old_p.clone()
        state.data = old_state_mem.clone()
        opt.step()
        assert torch.equal(old_p, before_p), "the old param memory was written"
        assert torch.equal(old_state_mem, before_state), "the old state memory was written"
        assert not torch.equal(ps[1].data, before_p) and not torch.equal(state.data, before_state)
        results.append([p.detach().clone() for p in ps])
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert table_calls == {"ran": 2, "stale": 1}   # the op saw the move itself


def _lists():
    ps = [torch.randn(300), torch.randn(7)]
    gs = [torch.randn(300) * 1e-2, torch.randn(7, dtype=torch.bfloat16)]
    states = [quant_state.empty_state(p.numel()) for p in ps]
    codes = [[st[k] for st in states] for k in quant_state.CODE_KEYS]
    outs = [torch.zeros(300, dtype=torch.bfloat16), torch.zeros(7, dtype=torch.float16)]
    steps = [torch.tensor(0.0), torch.tensor(3.0)]
    return ps, gs, codes, outs, steps


@pytest.mark.parametrize("move", ["param .data", "codes resize_", "scales .data", "step .data"])
def test_a_stale_table_step_writes_nothing(native, move):
    ps, gs, codes, outs, steps = _lists()
    table, _ = native.adam8bit_table(ps, gs, *codes, outs, steps)
    assert native.adam8bit_table_step(table, *HP) is True
    assert [float(s) for s in steps] == [1.0, 4.0]
    if move == "param .data":
        ps[1].data = ps[1].data.clone()
    elif move == "codes resize_":
        codes[2][0].resize_(1 << 16)      # exp_avg_sq codes grow: new memory
    elif move == "scales .data":
        codes[1][0].data = codes[1][0].data.clone()
    else:
        steps[0].data = torch.tensor(1.0)
    tracked = ps + [t for c in codes for t in c] + steps
    before = [t.clone() for t in tracked]
    assert native.adam8bit_table_step(table, *HP) is False
    assert all(torch.equal(b, t) for b, t in zip(before, tracked)), "a stale table wrote"


def test_scales_of_another_block_count_are_stale(native):
    """The scales' size is checked (as the block count): scales shrunk in place keep their address, and the size
    alone must make the table stale."""
    ps, gs, codes, outs, steps = _lists()
    table, _ = native.adam8bit_table(ps, gs, *codes, outs, steps)
    address = codes[3][0].data_ptr()
    codes[3][0].resize_(1)                          # 2 blocks -> 1, same memory
    assert codes[3][0].data_ptr() == address
    before = [p.clone() for p in ps]
    assert native.adam8bit_table_step(table, *HP) is False
    assert all(torch.equal(a, b) for a, b in zip(before, ps))


def test_table_errors_name_the_tensor(native, table_calls):
    ps, gs, codes, outs, steps = _lists()
    with pytest.raises(ValueError, match=r"params\[1\] state\['exp_avg_sq_scales'\] must be a contiguous float32 "
                                         r"cpu tensor of 1 elements"):
        native.adam8bit_table(ps, gs, codes[0], codes[1], codes[2], [codes[3][0], torch.zeros(2)], outs, steps)
    with pytest.raises(ValueError, match=r"cpu_adam8bit_table_: the work table must be a contiguous int64 cpu "
                                         r"tensor of shape \[n, 20\]"):
        native.adam8bit_table_step(torch.zeros(2, 17, dtype=torch.int64), *HP)
    ps_, opt = _cached()
    ps_[1].data = torch.randn(70, 5).t()                        # same shape, not contiguous
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[1\] is not contiguous"):
        opt.step()
    ps_[1].data = torch.randn(5, 70)
    opt.step()                                                  # fixed: the table path again
    assert table_calls["ran"] >= 2


def test_opcheck_table_ops(native):
    ps, gs, codes, outs, steps = _lists()
    torch.library.opcheck(torch.ops.dsfast.cpu_adam8bit_table_fill_.default,
                          (torch.zeros(2, 20, dtype=torch.int64), ps, gs, *codes, outs, steps, "params"))
    table, _ = native.adam8bit_table(ps, gs, *codes, outs, steps)
    torch.library.opcheck(torch.ops.dsfast.cpu_adam8bit_table_.default, (table, *HP, 0.5, 1, "auto"))
