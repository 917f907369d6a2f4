"""The work-table fast path of CPUAdam/CPUSGD (one int64 table per cached group instead of tensor
lists): bit-identical to the list op, rebuilt when a tensor moves, same errors, and opcheck of the ops."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dsfast.optim as O
from dsfast.optim import _cpu_op
from _cpu_optim_helpers import adam_lists, list_op_then_tables, native  # noqa: F401  (native: a fixture)

SHAPES = [(37,), (5, 7), (1,), (300,)]


@pytest.fixture
def table_calls(native, monkeypatch):
    """Counts the table steps that ran (so a test knows the fast path ran), and under "<kind> stale"
    those the op refused because a tensor had moved since the table was filled."""
    calls = {"adam": 0, "sgd": 0, "adam stale": 0, "sgd stale": 0}
    for kind in ("adam", "sgd"):
        real = getattr(native, f"{kind}_table_step")

        def counted(*a, _real=real, _kind=kind, **k):
            ran = _real(*a, **k)
            calls[_kind if ran else f"{_kind} stale"] += 1
            return ran
        monkeypatch.setattr(native, f"{kind}_table_step", counted)
    return calls


def make_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def grads_for(step, fresh):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g) for s in SHAPES]


def run(make_opt, steps, tables, monkeypatch, fresh_grads, halves=None):
    """Params after `steps` steps, with the table path on or off. fresh_grads: new grad tensors
    every step (a zero_grad(set_to_none) loop) or the same ones refilled (DeepSpeed's buffers)."""
    with monkeypatch.context() as m:
        if not tables:
            m.setattr(_cpu_op, "tables_usable", lambda: False)
        ps = make_params()
        opt = make_opt(ps)
        outs = [[torch.zeros(s, dtype=d) for s, d in zip(SHAPES, halves)]] if halves else None
        for k in range(steps):
            for p, g in zip(ps, grads_for(k, fresh_grads)):
                if fresh_grads or p.grad is None:
                    p.grad = g
                else:
                    p.grad.copy_(g)
            opt.step(fp16_param_groups=outs) if outs else opt.step()
        return ps, opt, outs


ADAMS = [dict(adamw_mode=True, weight_decay=0.01), dict(adamw_mode=False, weight_decay=0.1),
         dict(adamw_mode=True, weight_decay=0.0, bias_correction=False)]
SGDS = [dict(momentum=0.9, weight_decay=0.01), dict(momentum=0.9, nesterov=True), dict(momentum=0.0),
        dict(momentum=0.5, dampening=0.3, maximize=True)]


@pytest.mark.parametrize("fresh", [False, True], ids=["same-grads", "new-grads"])
@pytest.mark.parametrize("halves", [None, (torch.bfloat16, torch.float16, torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("kind,kw", [("adam", kw) for kw in ADAMS] + [("sgd", kw) for kw in SGDS])
def test_table_path_is_bit_identical_to_the_list_op(native, table_calls, monkeypatch, kind, kw, halves, fresh):
    cls = O.CPUAdam if kind == "adam" else O.CPUSGD
    make = lambda ps: cls(ps, lr=0.01, **kw)  # noqa: E731
    ref, ref_opt, ref_outs = run(make, 4, False, monkeypatch, fresh, halves)
    assert table_calls[kind] == 0
    got, opt, outs = run(make, 4, True, monkeypatch, fresh, halves)
    assert table_calls[kind] == 3          # step 1 creates the state (list op), then the table
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    for p, q in zip(got, ref):
        for key, t in opt.state[p].items():
            assert torch.equal(t, ref_opt.state[q][key]), key
    if halves:
        for a, b in zip(outs[0], ref_outs[0]):
            assert a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_op_level_tables_match_lists_with_mixed_grad_dtypes(native, momentum):
    """grad dtypes fp32/bf16/fp16 and bf16/fp16/no outputs in one call, directly on the ops."""
    gdt = [torch.float32, torch.bfloat16, torch.float16, torch.bfloat16]
    odt = [torch.bfloat16, torch.float16, None, torch.float16]

    def tensors():
        g = torch.Generator().manual_seed(3)
        ps = [torch.randn(s, generator=g) for s in SHAPES]
        gs = [torch.randn(s, generator=g).to(d) for s, d in zip(SHAPES, gdt)]
        ms = [torch.randn(s, generator=g) for s in SHAPES]
        vs = [torch.rand(s, generator=g) for s in SHAPES]
        outs = [None if d is None else torch.zeros(s, dtype=d) for s, d in zip(SHAPES, odt)]
        steps = [torch.tensor(float(i)) for i in range(len(SHAPES))]   # per-param step counts differ
        return ps, gs, ms, vs, outs, steps
    hp = (1e-2, 0.9, 0.99, 1e-8, 0.01, True, True, 0.5, 1)
    a, b = tensors(), tensors()
    table, keep = native.adam_table(*b)
    for _ in range(3):
        native.adam_step(*a, *hp)
        native.adam_table_step(table, *hp)
    for la, lb in zip(a, b):
        for x, y in zip(la, lb):
            assert (x is None and y is None) or torch.equal(x, y)
    assert [s.item() for s in b[5]] == [3.0, 4.0, 5.0, 6.0]

    a, b = tensors(), tensors()
    bufs = lambda t: t[2] if momentum else []  # noqa: E731
    hs = (0.1, momentum, 0.0, 0.01, False, 2.0, 1)
    table, keep = native.sgd_table(b[0], b[1], bufs(b), b[4])
    for _ in range(3):
        native.sgd_step(a[0], a[1], bufs(a), a[4], [False] * len(SHAPES) if momentum else [], *hs)
        native.sgd_table_step(table, *hs)
    for la, lb in zip(a, b):
        for x, y in zip(la, lb):
            assert (x is None and y is None) or torch.equal(x, y)


def _cached_opt(cls, **kw):
    ps = make_params()
    opt = cls(ps, lr=0.01, **kw)
    for k in range(2):
        for p, g in zip(ps, grads_for(k, True)):
            p.grad = g
        opt.step()
    return ps, opt


@pytest.mark.parametrize("cls,kw", [(O.CPUAdam, {}), (O.CPUSGD, dict(momentum=0.9))])
def test_repointed_tensors_are_picked_up(native, table_calls, monkeypatch, cls, kw):
    """p.data = new (as ZeRO does) and a state tensor's .data re-pointed between steps: the table is
    rebuilt and the old memory is never written."""
    results = []
    for _ in list_op_then_tables(monkeypatch):
        ps, opt = _cached_opt(cls, **kw)
        old_p, old_state = ps[1].data, opt.state[ps[3]]["exp_avg" if cls is O.CPUAdam else "momentum_buffer"]
        before_p, before_state = old_p.clone(), old_state.data.clone()
        ps[1].data = old_p.clone()
        old_state_mem = old_state.data
        old_state.data = old_state_mem.clone()
        opt.step()
        assert torch.equal(old_p, before_p), "the old param memory was written"
        assert torch.equal(old_state_mem, before_state), "the old state memory was written"
        assert not torch.equal(ps[1].data, before_p) and not torch.equal(old_state.data, before_state)
        results.append([p.detach().clone() for p in ps])
    for a, b in zip(*results):
        assert torch.equal(a, b)
    kind = "adam" if cls is O.CPUAdam else "sgd"
    assert table_calls[kind] == 2 and table_calls[f"{kind} stale"] == 1   # the op saw the move itself


@pytest.mark.parametrize("cls,kw,key", [(O.CPUAdam, {}, "exp_avg"), (O.CPUAdam, {}, "exp_avg_sq"),
                                        (O.CPUAdam, {}, "step"), (O.CPUSGD, dict(momentum=0.9), "momentum_buffer"),
                                        (O.CPUAdam8bit, {}, "exp_avg_codes"), (O.CPUAdam8bit, {}, "exp_avg_sq_scales"),
                                        (O.CPUAdam8bit, {}, "step")])
def test_a_state_entry_replaced_by_another_tensor_is_used(native, monkeypatch, cls, kw, key):
    """opt.state[p][key] = another tensor (a moment reset, a state copied in by hand): the cached lists are not
    used, the new tensor is updated and the replaced one never written, as the list op does."""
    results = []
    for _ in list_op_then_tables(monkeypatch):
        ps, opt = _cached_opt(cls, **kw)
        old = opt.state[ps[3]][key]
        before = old.clone()
        opt.state[ps[3]][key] = new = old.clone()
        opt.step()
        assert torch.equal(old, before), "the replaced state tensor was written"
        assert not torch.equal(new, before), "the new state tensor was not updated"
        results.append([p.detach().clone() for p in ps])
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("cls,kw", [(O.CPUAdam, {}), (O.CPUSGD, dict(momentum=0.9))])
def test_param_narrowed_in_place_of_its_storage_is_refused(native, cls, kw):
    """p.data = p.data[:k] keeps the data_ptr; the numel check still rebuilds (and the grad no longer fits)."""
    ps, opt = _cached_opt(cls, **kw)
    full = ps[3].data
    ps[3].data = full[:100]
    tail = full[100:].clone()
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[3\]\.grad has shape \[300\] but the "
                                         r"parameter has shape \[100\]"):
        opt.step()
    assert torch.equal(full[100:], tail)


@pytest.mark.parametrize("cls,kw", [(O.CPUAdam, {}), (O.CPUSGD, dict(momentum=0.9))])
def test_table_rebuild_errors_name_the_parameter(native, table_calls, cls, kw):
    ps, opt = _cached_opt(cls, **kw)
    ps[1].data = torch.randn(7, 5).t()                         # same shape, not contiguous
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[1\] is not contiguous"):
        opt.step()
    ps[1].data = torch.randn(5, 7)
    ps[3].grad = torch.randn(600)[::2]
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[3\]\.grad is not contiguous"):
        opt.step()
    ps[3].grad = torch.randn(300)
    ps[0].data = torch.randn(37, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['params'\]\[0\] has dtype torch.float64"):
        opt.step()
    ps[0].data = torch.randn(37)
    halves = [[torch.zeros(s, dtype=torch.float32) for s in SHAPES]]
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['params'\]\[0\] 16-bit output has dtype"):
        opt.step(fp16_param_groups=halves)
    opt.step()                                                 # all fixed: the table path again
    assert table_calls["adam" if cls is O.CPUAdam else "sgd"] >= 2


def test_table_ops_refuse_bad_tables(native):
    hp = (1e-2, 0.9, 0.99, 1e-8, 0.0, True, True)
    with pytest.raises(ValueError, match=r"cpu_adam_table_: the work table must be a contiguous int64 cpu tensor "
                                         r"of shape \[n, 17\]"):
        native.adam_table_step(torch.zeros(2, 7, dtype=torch.int64), *hp)
    with pytest.raises(ValueError, match="int64"):
        native.sgd_table_step(torch.zeros(2, 7, dtype=torch.int32), 0.1, 0.0, 0.0, 0.0, False)
    p, g = torch.randn(4), torch.randn(4)
    table, _ = native.adam_table([p], [g], [torch.zeros(4)], [torch.zeros(4)], [], [torch.tensor(0.0)])
    table[0, 7] = 9                                            # a grad dtype code that does not exist
    with pytest.raises(ValueError, match="row 0 of the work table is corrupt"):
        native.adam_table_step(table, *hp)
    table[0, 7] = 0
    table[0, 9] = 5                                            # a param dtype code that does not exist
    with pytest.raises(ValueError, match="row 0 of the work table is corrupt"):
        native.adam_table_step(table, *hp)
    with pytest.raises(ValueError, match=r"cpu_adam_table_fill_: .*shape \[2, 17\]"):
        torch.ops.dsfast.cpu_adam_table_fill_(torch.zeros(1, 17, dtype=torch.int64), [p, p], [g, g], [p, p], [p, p],
                                              [], [torch.tensor(0.0)] * 2)
    with pytest.raises(ValueError, match=r"params\[0\]\.grad has shape \[3\]"):
        native.adam_table([p], [torch.randn(3)], [torch.zeros(4)], [torch.zeros(4)], [], [torch.tensor(0.0)])
    table, _ = native.sgd_table([p], [g], [], [])              # filled for momentum 0
    with pytest.raises(ValueError, match="row 0 has no momentum buffer"):
        native.sgd_table_step(table, 0.1, 0.9, 0.0, 0.0, False)


def test_tables_not_used_under_a_dispatch_mode_or_compile(native):
    assert _cpu_op.tables_usable()

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    with Watch():
        assert not _cpu_op.tables_usable()
    assert torch.compile(lambda: _cpu_op.tables_usable(), backend="eager")() is False


def test_opcheck_table_ops(native):
    n = 3
    ps, gs, ms, vs, outs, steps = adam_lists(n, bf16_grad=True, out_dtype=torch.float16, distinct_steps=True)
    torch.library.opcheck(torch.ops.dsfast.cpu_adam_table_fill_.default,
                          (torch.zeros(n, 17, dtype=torch.int64), ps, gs, ms, vs, outs, steps, "params"))
    table, _ = native.adam_table(ps, gs, ms, vs, outs, steps)
    torch.library.opcheck(torch.ops.dsfast.cpu_adam_table_.default,
                          (table, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, True, 0.5, 1, "auto"))
    torch.library.opcheck(torch.ops.dsfast.cpu_sgd_table_fill_.default,
                          (torch.zeros(n, 13, dtype=torch.int64), ps, gs, ms, outs, "params"))
    sgd_table, _ = native.sgd_table(ps, gs, ms, outs)
    torch.library.opcheck(torch.ops.dsfast.cpu_sgd_table_.default,
                          (sgd_table, 0.1, 0.9, 0.0, 0.01, False, 1.0, 1, "auto"))
    # opcheck calls an op several times on copies: only an empty reference list may be released so
    torch.library.opcheck(torch.ops.dsfast.cpu_table_release_.default, (torch.zeros(n, 6, dtype=torch.int64),))


HP = (1e-2, 0.9, 0.999, 1e-8, 0.0, True, True)


@pytest.mark.parametrize("move", ["param .data", "state resize_", "step .data", "grad set_"])
def test_a_stale_table_step_writes_nothing(native, move):
    """The op itself checks every tensor of the table before writing: a moved one -> False, nothing
    updated (params, moments and step counters as they were), the old memory untouched."""
    ps, gs, ms, vs, outs, steps = adam_lists()
    table, _ = native.adam_table(ps, gs, ms, vs, outs, steps)
    assert native.adam_table_step(table, *HP) is True
    moved = {"param .data": ps[1], "state resize_": vs[2], "step .data": steps[0], "grad set_": gs[0]}[move]
    old_mem, old_values = moved.data, moved.detach().clone()
    if move == "param .data":
        ps[1].data = ps[1].data.clone()
    elif move == "state resize_":
        vs[2].resize_(1 << 16)           # grows: new memory, the old one freed
    elif move == "step .data":
        steps[0].data = torch.tensor(1.0)
    else:
        gs[0].set_(torch.randn(5))
    tracked = ps + ms + vs[:2] + steps
    before = [t.clone() for t in tracked]
    assert native.adam_table_step(table, *HP) is False
    assert all(torch.equal(b, t) for b, t in zip(before, tracked)), "a stale table wrote"
    if move != "state resize_":
        assert torch.equal(old_mem, old_values), "the old memory was written"
    rebuilt, _ = native.adam_table(ps, gs, ms, vs[:2] + [torch.zeros(7)], outs, steps)
    assert native.adam_table_step(rebuilt, *HP) is True


def test_a_table_keeps_its_tensors_alive_until_it_is_freed(native):
    import gc
    import weakref
    ps, gs, ms, vs, outs, steps = adam_lists()
    table, _ = native.adam_table(ps, gs, ms, vs, outs, steps)
    watched = weakref.ref(gs[1])
    expect = ps[1].clone()
    del gs
    gc.collect()
    assert watched() is not None, "the table must hold its gradients"
    grad = watched()
    ref = torch.optim.Adam([torch.nn.Parameter(expect)], lr=HP[0], betas=HP[1:3], eps=HP[3])
    ref.param_groups[0]["params"][0].grad = grad.clone()
    ref.step()
    del grad
    assert native.adam_table_step(table, *HP) is True
    torch.testing.assert_close(ps[1], ref.param_groups[0]["params"][0].detach(), rtol=1e-6, atol=1e-7)
    del table
    gc.collect()
    assert watched() is None, "a freed table must give its references back"


def test_a_row_without_its_references_is_stale(native):
    ps, gs, ms, vs, outs, steps = adam_lists()
    table, _ = native.adam_table(ps, gs, ms, vs, outs, steps)
    forged = table.clone()
    forged[:, 9:] = 0                     # addresses without references: never written through
    before = [p.clone() for p in ps]
    assert native.adam_table_step(forged, *HP) is False
    assert all(torch.equal(a, b) for a, b in zip(before, ps))
    with pytest.raises(ValueError, match="cpu_table_release_: expects a contiguous int64 cpu tensor"):
        torch.ops.dsfast.cpu_table_release_(torch.zeros(2, 3, dtype=torch.int32))
