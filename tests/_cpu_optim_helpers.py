"""Shared fixtures for the CPU optimizer tests: the op, the ISAs to force, tolerances, op-level tensor lists."""
import pytest
import torch

from dsfast.ops import load, loaded_from

# Stated tolerances against torch.optim after several steps (fp32 math on both sides; the
# vector bodies fuse multiply-adds and use a multiply by 1/sqrt(bc2) where torch divides).
PARAM_TOL = dict(rtol=1e-5, atol=2e-6)
# exp_avg holds g (+ wd * p) of magnitude ~1, where cancellation leaves an ulp of ~1e-7 absolute
EXP_AVG_TOL = dict(rtol=1e-5, atol=1e-7)
STATE_TOL = dict(rtol=1e-5, atol=1e-8)


def cpu_op():
    return load("cpu_optim")


def isas():
    """Every instruction-set body this CPU can run (forced one by one), or the reference."""
    return list(cpu_op().available_isas())


def grads_as(dtype, tensors):
    """16-bit (or fp32) gradients and the exact fp32 values the kernel will read."""
    low = [t.to(dtype) for t in tensors]
    return low, [t.float() for t in low]


def assert_close(got, want, tol, what):
    torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{what}: {m}", **tol)


@pytest.fixture(scope="module")
def op():
    return cpu_op()


@pytest.fixture(scope="module")
def native():
    """The native cpu_optim op (skips where only the pure-torch reference could be loaded)."""
    op_ = load("cpu_optim")
    if loaded_from("cpu_optim") == "reference":
        pytest.skip("the native cpu_optim op is not built here (reference fallback)")
    return op_


def adam_lists(n=3, bf16_grad=False, out_dtype=None, distinct_steps=False):
    """(params, grads, exp_avgs, exp_avg_sqs, outs, steps) for the op-level calls: n fp32 tensors of 5.. elements;
    bf16_grad: the second gradient in bfloat16; out_dtype: 16-bit outputs of that dtype (else none);
    distinct_steps: step counters 0, 1, 2, ... (else all 0)."""
    ps = [torch.randn(5 + i) for i in range(n)]
    gs = [torch.randn(5 + i, dtype=torch.bfloat16 if bf16_grad and i == 1 else torch.float32) for i in range(n)]
    ms = [torch.zeros(5 + i) for i in range(n)]
    vs = [torch.zeros(5 + i) for i in range(n)]
    outs = [torch.zeros(5 + i, dtype=out_dtype) for i in range(n)] if out_dtype is not None else []
    steps = [torch.tensor(float(i) if distinct_steps else 0.0) for i in range(n)]
    return ps, gs, ms, vs, outs, steps


def list_op_then_tables(monkeypatch):
    """Yields twice, False then True: first with the work tables off (every step through the list op), then with
    them on, so that a test compares the two paths on the same steps."""
    from dsfast.optim import _cpu_op
    for tables in (False, True):
        with monkeypatch.context() as m:
            if not tables:
                m.setattr(_cpu_op, "tables_usable", lambda: False)
            yield tables
