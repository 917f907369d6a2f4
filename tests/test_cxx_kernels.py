"""Runs the torch-free C++ tests (csrc/tests, through CMake + ctest) from pytest, so the one
test command covers them. Skipped when cmake or a C++ compiler is missing."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, cwd, timeout):
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-6000:]}"
    return proc.stdout


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ctest") is None, reason="cmake not installed")
@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler")
@pytest.mark.skipif(sys.platform != "linux", reason="the kernels' C++ tests are run on Linux")
def test_cxx_kernel_tests_pass(tmp_path):
    build = tmp_path / "build"
    # the CUDA kernels (built by default when nvcc is found) are tests/test_cuda_build.py's job
    _run(["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DDSFAST_CUDA=OFF"], ROOT, 120)
    _run(["cmake", "--build", str(build), "-j", str(min(4, os.cpu_count() or 1))], ROOT, 300)
    out = _run(["ctest", "--output-on-failure", "-R", "^test_(optim_math|half_convert|cpu_kernels)$"], build, 300)
    assert "100% tests passed" in out, out
