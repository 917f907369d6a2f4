"""The native CPU ops as torch operators: torch.library.opcheck (schema, fake implementation,
mutation annotations, autograd registration), the ABI the loader recorded, and an optimizer
step through torch.compile."""
import pytest
import torch

from dsfast.ops import jit
from dsfast.ops.registry import OPS
from _cpu_optim_helpers import adam_lists, native  # noqa: F401  (native: a fixture)


def _adam_args(n=3, outs=True):
    lists = adam_lists(n, bf16_grad=True, out_dtype=torch.bfloat16 if outs else None, distinct_steps=True)
    return (*lists, 1e-2, 0.9, 0.999, 1e-8, 0.01, True, True, 0.5, 1, "auto", "params")


def test_opcheck_cpu_adam_step(native):
    torch.library.opcheck(torch.ops.dsfast.cpu_adam_step.default, _adam_args())
    torch.library.opcheck(torch.ops.dsfast.cpu_adam_step.default, _adam_args(outs=False))


def test_opcheck_cpu_sgd_step(native):
    ps = [torch.randn(7), torch.randn(3, 2)]
    gs = [torch.randn(7), torch.randn(3, 2, dtype=torch.float16)]
    bufs = [torch.randn(7), torch.randn(3, 2)]
    outs = [torch.zeros(7, dtype=torch.float16), torch.zeros(6, dtype=torch.float16)]
    for momentum, first in ((0.9, [True, False]), (0.0, [])):
        torch.library.opcheck(torch.ops.dsfast.cpu_sgd_step.default,
                              (ps, gs, bufs if momentum else [], outs, first, 0.1, momentum, 0.0, 0.01, False, 1.0, 1,
                               "auto", "params"))


def test_opcheck_info_ops(native):
    torch.library.opcheck(torch.ops.dsfast.cpu_openmp_enabled.default, ())
    # opcheck's AOT comparison cannot compare str results; the other checks run
    for name in ("cpu_available_isas", "cpu_optim_abi"):
        torch.library.opcheck(getattr(torch.ops.dsfast, name).default, (),
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_fake_tensor_run_checks_like_the_kernel(native):
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        args = list(_adam_args())
        torch.ops.dsfast.cpu_adam_step.default(*args)          # metadata only: nothing to compute
        args[2] = [torch.zeros(2)] + args[2][1:]
        with pytest.raises(ValueError, match=r"params\[0\] state\['exp_avg'\] has 2 elements"):
            torch.ops.dsfast.cpu_adam_step.default(*args)


def test_loader_records_the_abi(native):
    from dsfast.ops import abi
    spec = OPS["cpu_optim"]
    p = jit.plan(spec)
    assert p.abi == abi.choose() == native.abi()
    info = jit.cached_info(p.build_dir)
    if info is not None:                     # a JIT build (not a prebuilt one)
        assert info["abi"] == p.abi
    if p.abi == abi.STABLE:                  # one binary for every torch from the target on
        assert torch.__version__ not in str(p.build_dir)


def test_abi_setting_is_validated(monkeypatch):
    from dsfast.ops import abi
    monkeypatch.setenv("DSFAST_OP_ABI", "newest")
    with pytest.raises(ValueError, match="DSFAST_OP_ABI='newest'.*stable, classic"):
        abi.choose()
    monkeypatch.setenv("DSFAST_OP_ABI", "classic")
    assert abi.choose() == abi.CLASSIC
    monkeypatch.setattr(abi, "torch_version", lambda: (2, 9))
    monkeypatch.setenv("DSFAST_OP_ABI", "stable")
    with pytest.raises(ValueError, match="needs torch >= 2.10"):
        abi.choose()
    monkeypatch.delenv("DSFAST_OP_ABI")
    assert abi.choose() == abi.CLASSIC


@pytest.mark.parametrize("cls_name", ["CPUAdam", "CPUSGD"])
def test_optimizer_step_runs_under_torch_compile(native, cls_name):
    import dsfast.optim as O
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4)
    ref = torch.nn.Linear(6, 4)
    ref.load_state_dict(model.state_dict())
    kw = dict(lr=0.05, momentum=0.9) if cls_name == "CPUSGD" else dict(lr=0.05)
    opt, opt_ref = getattr(O, cls_name)(model.parameters(), **kw), getattr(O, cls_name)(ref.parameters(), **kw)
    step = torch.compile(opt.step)
    x = torch.randn(8, 6)
    for _ in range(3):
        for m, o in ((model, None), (ref, None)):
            m.zero_grad()
            m(x).pow(2).sum().backward()
        step()
        opt_ref.step()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.equal(model.weight, torch.nn.Linear(6, 4).weight)
