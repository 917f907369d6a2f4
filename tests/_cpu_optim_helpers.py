"""Shared fixtures for the CPU optimizer tests: the op, the ISAs to force, tolerances."""
import pytest
import torch

from dsfast.ops import load

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
