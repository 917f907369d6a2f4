"""The CUDA kernels (csrc/cuda) executed on the CPU by cuemu, the project's emulation of the CUDA
execution model (csrc/cuda/emu): g++ compiles the unmodified .cu sources against it, and
tests/gpu/test_cuda_optim_gpu.py's kernel tests run here with the same bodies, the `op` fixture
choosing the emulated kernels and the CPU as the device. Tolerances are that file's (fp32 rtol
1e-5 / atol 1e-6, 16-bit one unit in the last place), against dsfast/ops/reference.

Also here: the emulator's own tests (each strict check triggered and pointing at the right file
and line) and a run under another thread/block order. What this does not prove (timing,
coalescing, occupancy, memory ordering, FMA contraction, streams, the torch binding) is in the
README's section on the emulator; nvcc's register/spill check is in tests/test_cuda_build.py.

DSFAST_CUDA_EMU_LIB=<libdsfast_cuda_emu.so> tests a library built elsewhere (the sanitizer run,
the bug-injection script tests/cuda_emu_inject_bugs.py); then the build is skipped."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import _cuda_emu

ROOT = Path(__file__).resolve().parents[1]
SELFTEST_SRC = ROOT / "csrc" / "cuda" / "emu" / "tests" / "selftest.cpp"

_why_not = None if os.environ.get("DSFAST_CUDA_EMU_LIB") else _cuda_emu.missing_tools()
pytestmark = pytest.mark.skipif(_why_not is not None, reason=f"CUDA emulator cannot be built: {_why_not}")

# tests/gpu's kernel tests, imported under another name so that they are collected here too.
_spec = importlib.util.spec_from_file_location("_gpu_kernel_tests", ROOT / "tests" / "gpu" / "test_cuda_optim_gpu.py")
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)

KERNEL_TESTS = [
    "test_adam_every_dtype_combination_matches_reference",
    "test_sgd_every_dtype_combination_matches_reference",
    "test_fused_adam_matches_torch_fused_adamw_over_steps",
    "test_thousands_of_tensors_span_several_launches",
    "test_inf_and_nan_in_tails_raise_the_flag",
    "test_overflow_flag_leaves_params_and_states_untouched",
    "test_grad_scaler_on_cuda_skips_and_counts_like_torch",
    "test_unscale_norm_and_clip_match_torch",
]
# Not here: the >2^31-element test (needs ~40 GiB), sync debug mode, the binding's own argument
# errors and opcheck (the torch binding is not part of the emulated build).
for _name in KERNEL_TESTS:
    globals()[_name] = getattr(gpu, _name)
guards = gpu.guards  # the sentinel check after every test, as on the GPU


EMU_SIZES = tuple(n for n in gpu.SIZES if n < (1 << 20)) + (3 * 65536 + 5,)


@pytest.fixture(scope="session")
def emu_build(tmp_path_factory):
    if os.environ.get("DSFAST_CUDA_EMU_LIB"):
        lib = Path(os.environ["DSFAST_CUDA_EMU_LIB"])
        return lib.parent
    return _cuda_emu.build(tmp_path_factory.mktemp("cuda-emu"), jobs=min(2, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def emu_op(emu_build):
    lib = os.environ.get("DSFAST_CUDA_EMU_LIB") or emu_build / "libdsfast_cuda_emu.so"
    return _cuda_emu.EmulatedOp(lib)


@pytest.fixture
def op(emu_op, monkeypatch):
    """The device is the fixture's choice: the CPU, with the emulated kernels standing where the
    CUDA op stands (also behind dsfast.ops.multi_tensor, so FusedAdam and the clip/unscale helpers
    use them)."""
    from dsfast.ops import multi_tensor
    monkeypatch.setattr(gpu, "DEV", "cpu")
    # The GPU's sizes less the 2^20+3 tensor (85% of the elements, for a CPU comparing in torch):
    # a 4-chunk tensor stands for it, every vector tail and chunk edge stays.
    monkeypatch.setattr(gpu, "SIZES", EMU_SIZES)
    monkeypatch.setattr(multi_tensor, "backend", lambda device: emu_op)
    emu_op.set_order(os.environ.get("CUEMU_ORDER", "forward"), int(os.environ.get("CUEMU_SEED", "0")),
                     int(os.environ.get("CUEMU_WORKERS", "0")))
    return emu_op


@pytest.fixture(autouse=True)
def _emulated_device(request):
    # the tests that take no `op` (FusedAdam, GradScaler) still need the emulated device
    if request.function.__name__ in KERNEL_TESTS and "op" not in request.fixturenames:
        request.getfixturevalue("op")


def test_emulator_selftest_every_feature_in_every_order(emu_build):
    r = subprocess.run([str(emu_build / "dsfast_cuda_emu_selftest")], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0 and "all passed" in r.stdout, r.stdout


def _check_lines(case):
    return [i + 1 for i, line in enumerate(SELFTEST_SRC.read_text().splitlines())
            if re.search(rf"// CHECK: {re.escape(case)}$", line)]


STRICT = {
    "exited-barrier": "which has exited: every thread of the block must reach the barrier",
    "exited-shuffle": "the mask 0xffffffff names lane 5 (thread (",
    "different-barriers": "wait at different barriers",
    "different-warp-ops": "wait at different warp operations",
    "deadlock": "deadlock in kernel deadlock_kernel",
    "mask-without-self": "does not name the calling lane",
    "reads-outside-mask": "reads lane 20, which the mask 0x0000ffff does not name",
    "block-too-large": "2048 threads per block exceed the limit of 1024",
    "block-z-too-large": "block (1,1,65) exceeds the per-dimension limits",
    "grid-y-too-large": "grid (1,70000,1) exceeds the limits",
    "empty-grid": "a grid or block dimension is 0",
    "params-too-large": "40008 bytes of kernel parameters exceed the limit of 32764",
}


@pytest.mark.parametrize("order", ["forward", "reverse", "random"])
@pytest.mark.parametrize("case", sorted(STRICT))
def test_every_strict_check_names_file_and_line(emu_build, case, order):
    r = subprocess.run([str(emu_build / "dsfast_cuda_emu_selftest"), case, order], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert r.returncode == 3, f"no error for {case}:\n{r.stdout}"
    assert STRICT[case] in r.stdout, r.stdout
    lines = _check_lines(case)
    assert lines, f"selftest.cpp marks no line for {case}"
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"{SELFTEST_SRC}:") or first.startswith("selftest.cpp:") or "selftest.cpp:" in first
    for line in lines:  # every marked line is named in the message
        assert f"selftest.cpp:{line}" in r.stdout, (line, r.stdout)


def test_host_errors_reach_python(op):
    """An exception of the host code (here dispatch_dtype's) comes back as the op's RuntimeError."""
    import ctypes
    g, s, f = torch.zeros(8), torch.ones(()), torch.zeros(())
    err = op.lib.dsfast_emu_unscale_and_check(ctypes.c_int64(1), (ctypes.c_int64 * 1)(8),
                                              (ctypes.c_void_p * 1)(g.data_ptr()), 7, _cuda_emu._fptr(s),
                                              _cuda_emu._fptr(f))
    with pytest.raises(RuntimeError, match="dsfast unscale_and_check: unsupported dtype"):
        op._check(err)


@pytest.mark.parametrize("order,seed", [("reverse", 0), ("random", 11)])
def test_kernels_match_reference_in_other_orders(op, order, seed):
    """The block reductions and the overflow flag must not depend on which thread or block runs first."""
    op.set_order(order, seed, workers=1)
    try:
        sizes = (17, 4097, 65539, 3 * 65536 + 5)
        for dtype in (torch.float32, torch.bfloat16):
            ts = [gpu.rand(n, dtype, 100 + i, misalign=i % 2 == 1) for i, n in enumerate(sizes)]
            total, per, clip = op.l2_norm(ts, True, None, None, 0.5)
            exact = torch.stack([t.double().norm() for t in ts])
            torch.testing.assert_close(per.double(), exact, rtol=1e-5, atol=0)
            torch.testing.assert_close(total.double(), exact.norm(), rtol=1e-5, atol=0)
            torch.testing.assert_close(clip, torch.clamp(0.5 / (total + 1e-6), max=1.0), rtol=0, atol=0)
            ts[2][-1] = float("nan")
            flag = torch.zeros(())
            op.unscale_and_check_(ts, torch.tensor(0.25), flag)
            assert float(flag) == 1.0
    finally:
        op.set_order("forward", 0, workers=0)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("DSFAST_CUDA_EMU_SANITIZE") != "1" or os.environ.get("DSFAST_CUDA_EMU_LIB"),
                    reason="on demand (about 3 minutes of CPU): DSFAST_CUDA_EMU_SANITIZE=1 runs this file again on "
                           "an ASan + UBSan build of the emulated kernels")
def test_the_same_run_under_asan_and_ubsan(tmp_path):
    import shutil
    out = _cuda_emu.build(tmp_path / "asan", sanitize=True, jobs=min(2, os.cpu_count() or 1))
    r = subprocess.run([str(out / "dsfast_cuda_emu_selftest")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=300)
    assert r.returncode == 0 and "all passed" in r.stdout, r.stdout
    cxx = shutil.which("g++") or "g++"
    lib = {n: subprocess.run([cxx, f"-print-file-name={n}"], stdout=subprocess.PIPE, text=True).stdout.strip()
           for n in ("libasan.so", "libstdc++.so")}
    # python itself is not instrumented: the ASan runtime is preloaded, with libstdc++ (python does not link it,
    # and ASan's __cxa_throw interceptor needs it at start-up); torch's own allocations are not leaks of ours
    env = dict(os.environ, DSFAST_CUDA_EMU_LIB=str(out / "libdsfast_cuda_emu.so"),
               LD_PRELOAD=f"{lib['libasan.so']} {lib['libstdc++.so']}",
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1", UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
               PYTHONPATH=str(ROOT))
    env.pop("DSFAST_CUDA_EMU_SANITIZE")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__], cwd=ROOT, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-6000:]
    assert "Sanitizer" not in r.stdout and "runtime error" not in r.stdout, r.stdout[-6000:]


def test_launch_sizes_are_the_ones_the_register_check_assumes(op):
    """tests/test_cuda_build.py checks each kernel's registers against its threads per block
    (KERNEL_THREADS); the emulator sees the real launches, so the table is checked against them."""
    from test_cuda_build import KERNEL_THREADS
    ts = [gpu.rand(n, torch.float32, i) for i, n in enumerate((5, 70000))]
    op.l2_norm(ts, True, None, None, 1.0)
    op.unscale_and_check_(ts, torch.tensor(0.5), torch.zeros(()))
    seen = op.launch_sizes()
    for name, threads in seen.items():
        kernel = [k for k in KERNEL_THREADS if k in name]
        assert kernel, f"{name} is launched but has no entry in tests/test_cuda_build.py's KERNEL_THREADS"
        assert threads <= KERNEL_THREADS[kernel[0]], (name, threads)
    assert {k for k in KERNEL_THREADS if any(k in n for n in seen)} == set(KERNEL_THREADS), seen
