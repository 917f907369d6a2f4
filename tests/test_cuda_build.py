"""CI checks of the CUDA sources without a GPU: nvcc builds every .cu for sm_80 and sm_90 via
CMake, and the torch binding compiles (to an object file, for the stable and the classic torch
ABI) against the installed torch headers,
which on the CPU wheel lack the generated c10/cuda config (hence C10_CUDA_NO_CMAKE_CONFIGURE_FILE)."""
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CUDA_DIR = ROOT / "csrc" / "cuda"
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not found: the CUDA build check needs it")
needs_cmake = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found")


def _cuda_include():
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), Path(NVCC).resolve().parent.parent,
             Path(NVCC).parent.parent, "/usr/local/cuda"]
    for home in homes:
        if home and (Path(home) / "include" / "cuda_runtime.h").exists():
            return Path(home) / "include"
    pytest.skip("CUDA headers (cuda_runtime.h) not found; set CUDA_HOME")


def _run(cmd, cwd, timeout, env=None):
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-4000:]}"
    return r.stdout


def test_every_cu_file_is_in_the_cmake_build():
    listed = re.search(r"set\(DSFAST_CUDA_SOURCES([^)]*)\)", (CUDA_DIR / "CMakeLists.txt").read_text())
    assert listed, "csrc/cuda/CMakeLists.txt must list its sources in DSFAST_CUDA_SOURCES"
    on_disk = sorted(p.name for p in CUDA_DIR.glob("*.cu"))
    assert sorted(listed.group(1).split()) == on_disk


def test_registered_op_builds_every_cu_file():
    from dsfast.ops.registry import OPS
    spec = OPS["cuda_optim"]
    assert spec.with_cuda
    in_spec = sorted(Path(s).name for s in spec.sources if s.endswith(".cu"))
    assert in_spec == sorted(p.name for p in CUDA_DIR.glob("*.cu"))
    assert "bindings/cuda_optim.cpp" in spec.sources


# Threads per block of every kernel's launch (csrc/cuda): the most registers a kernel may use is
# what the SM's 64K registers give that many threads. A new kernel must be added here.
KERNEL_THREADS = {"multi_tensor_kernel": 512, "per_tensor_kernel": 8 * 32, "total_kernel": 1024}
REGISTERS_PER_SM = 65536


def ptxas_resources(text):
    """Per (kernel, arch) entry of nvcc --resource-usage / -Xptxas -v output: registers and spill bytes.
    A spill line belongs to the function its "Function properties for" line names: an entry, or a
    device function it calls (e.g. __internal_accurate_pow), whose spills count against that entry."""
    entries, cur, props = [], None, None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for '(sm_\d+a?)'", line)
        if m:
            name = next((k for k in KERNEL_THREADS if k in m[1]), m[1])
            cur = {"kernel": name, "symbol": m[1], "arch": m[2], "registers": None, "spill": None, "callee_spill": {}}
            entries.append(cur)
            props = None
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m[1]
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and cur is not None:
            if props == cur["symbol"]:
                cur["spill"] = int(m[1]) + int(m[2])
            elif props is not None and int(m[1]) + int(m[2]):
                cur["callee_spill"][props] = int(m[1]) + int(m[2])
        m = re.search(r"Used (\d+) registers", line)
        if m and cur is not None:
            cur["registers"] = int(m[1])
    return entries


def register_limit(threads):
    """Registers per thread that still let one block of `threads` threads launch (allocated per warp,
    per thread in units of 8; at most 255)."""
    warps = (threads + 31) // 32
    return min(255, REGISTERS_PER_SM // (warps * 32) // 8 * 8)


def resource_problems(entries):
    problems = []
    for e in entries:
        where = f"{e['kernel']} ({e['arch']}, {e['symbol'][:80]})"
        if e["kernel"] not in KERNEL_THREADS:
            problems.append(f"{where}: no launch size known; add the kernel to KERNEL_THREADS")
            continue
        if e["registers"] is None or e["spill"] is None:
            problems.append(f"{where}: ptxas printed no register/spill line")
            continue
        limit = register_limit(KERNEL_THREADS[e["kernel"]])
        if e["registers"] > limit:
            problems.append(f"{where}: {e['registers']} registers, more than the {limit} a "
                            f"{KERNEL_THREADS[e['kernel']]}-thread launch allows")
        if e["spill"]:
            problems.append(f"{where}: {e['spill']} bytes of register spills")
        for fn, n in e["callee_spill"].items():
            problems.append(f"{where}: {n} bytes of register spills in {fn}, which it calls")
    return problems


def test_resource_check_fails_on_spills_and_too_many_registers():
    fake = """ptxas info    : Compiling entry function '_ZN6dsfast4cuda12total_kernelEv' for 'sm_90'
ptxas info    : Function properties for _ZN6dsfast4cuda12total_kernelEv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers
ptxas info    : Compiling entry function '_ZN6dsfast4cuda19multi_tensor_kernelEv' for 'sm_80'
ptxas info    : Function properties for _ZN6dsfast4cuda19multi_tensor_kernelEv
    16 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers
ptxas info    : Function properties for __internal_accurate_pow
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z10new_kernelv' for 'sm_80'
ptxas info    : Used 8 registers
ptxas info    : Compiling entry function '_ZN6dsfast4cuda17per_tensor_kernelEv' for 'sm_80'
ptxas info    : Function properties for _ZN6dsfast4cuda17per_tensor_kernelEv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers
"""
    problems = resource_problems(ptxas_resources(fake))
    assert len(problems) == 3, problems
    assert "72 registers, more than the 64 a 1024-thread launch allows" in problems[0]
    assert "16 bytes of register spills" in problems[1]
    assert "add the kernel to KERNEL_THREADS" in problems[2]
    assert [register_limit(t) for t in (1024, 512, 256, 96)] == [64, 128, 255, 255]


@pytest.mark.slow
@needs_nvcc
@needs_cmake
def test_cmake_builds_every_kernel_for_sm80_and_sm90(tmp_path):
    """The plain `cmake -S . -B build` builds the CUDA kernels once a CUDA compiler is found (no -D needed)."""
    build = tmp_path / "build"
    env = dict(os.environ, CUDACXX=NVCC)  # cmake finds nvcc even when it is not on PATH
    out = _run(["cmake", "-S", str(ROOT), "-B", str(build)], ROOT, 300, env)
    assert "dsfast: building the CUDA kernels with" in out
    # -j1: ptxas's --resource-usage lines of one kernel must not interleave with another file's
    usage = _run(["cmake", "--build", str(build), "--target", "dsfast_cuda_kernels", "-j1"], ROOT, 900, env)
    kernels = ptxas_resources(usage)
    assert {(k["kernel"], k["arch"]) for k in kernels} >= {(k, a) for k in KERNEL_THREADS for a in ("sm_80", "sm_90")}, \
        "nvcc --resource-usage printed no line for some kernel:\n" + usage[-3000:]
    problems = resource_problems(kernels)
    assert not problems, "\n".join(problems)
    _run(["cmake", "--build", str(build), "--target", "dsfast_cuda_plan_test", "-j2"], ROOT, 600, env)
    objects = sorted(o for o in build.rglob("*.cu.o") if "plan_test" not in str(o))
    assert sorted(o.name for o in objects) == sorted(p.name + ".o" for p in CUDA_DIR.glob("*.cu"))
    for obj in objects:
        data = obj.read_bytes()
        for arch in (b"sm_80", b"sm_90"):
            assert arch in data, f"{obj.name} has no {arch.decode()} code"
    # The launcher's plan runs on the host: every element once, right pointers, >2^31 offsets.
    plan = next(build.rglob("dsfast_cuda_plan_test"))
    out = _run([str(plan)], ROOT, 60)
    assert "all passed" in out


def _configure(tmp_path, *flags, cudacxx):
    env = dict(os.environ, CUDACXX=str(cudacxx))
    build = tmp_path / "build"
    r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), *flags], cwd=ROOT, env=env, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    return r.returncode, r.stdout, (build / "csrc" / "cuda").exists()


def _no_cuda_compiler(tmp_path):
    fake = tmp_path / "nvcc"          # CMake's probe of it fails, as with no toolkit at all
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    return fake


@needs_cmake
def test_cmake_without_a_cuda_compiler_builds_the_rest(tmp_path):
    rc, out, cuda = _configure(tmp_path, cudacxx=_no_cuda_compiler(tmp_path))
    assert rc == 0 and not cuda, out
    assert "dsfast: no CUDA compiler found" in out


@needs_cmake
def test_cmake_cuda_on_without_a_compiler_is_an_error(tmp_path):
    rc, out, _ = _configure(tmp_path, "-DDSFAST_CUDA=ON", cudacxx=_no_cuda_compiler(tmp_path))
    assert rc != 0 and "DSFAST_CUDA=ON but no CUDA compiler was found" in out and "-DDSFAST_CUDA=OFF" in out


@needs_cmake
@needs_nvcc
def test_cmake_cuda_off_skips_the_kernels_even_with_nvcc(tmp_path):
    rc, out, cuda = _configure(tmp_path, "-DDSFAST_CUDA=OFF", cudacxx=NVCC)
    assert rc == 0 and not cuda, out
    assert "DSFAST_CUDA=OFF: the CUDA kernels are not built" in out and "Looking for a CUDA compiler" not in out


@needs_cmake
def test_cmake_cuda_bad_value_lists_the_valid_ones(tmp_path):
    rc, out, _ = _configure(tmp_path, "-DDSFAST_CUDA=maybe", cudacxx=_no_cuda_compiler(tmp_path))
    assert rc != 0 and "DSFAST_CUDA=maybe is not valid; use AUTO (the default), ON or OFF" in out


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("op_abi", ["stable", "classic"])
def test_binding_compiles_against_installed_torch_headers(tmp_path, op_abi):
    from dsfast.ops import abi
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler found")
    tinc = Path(torch.__file__).parent / "include"
    if op_abi == "stable" and abi.torch_version() < abi.STABLE_TARGET:
        pytest.skip(f"torch {torch.__version__} has no stable ABI for the binding")
    if op_abi == "classic" and not (tinc / "c10" / "cuda" / "CUDAStream.h").exists():
        pytest.skip(f"this torch ({torch.__version__}) ships no c10/cuda headers")
    std = "-std=c++20" if abi.torch_version() >= (2, 10) else "-std=c++17"
    cmd = [cxx, std, "-O0", "-fPIC", "-c", str(ROOT / "csrc/bindings/cuda_optim.cpp"), "-o", str(tmp_path / "cuda_optim.o"),
           "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE", *abi.cflags(op_abi, with_cuda=True),
           f"-I{tinc}", f"-I{tinc / 'torch/csrc/api/include'}", f"-I{sysconfig.get_paths()['include']}",
           f"-I{_cuda_include()}"]
    _run(cmd, ROOT, 600)
    assert (tmp_path / "cuda_optim.o").stat().st_size > 0
    # the object registers the ops under the dsfast namespace (TORCH_LIBRARY), not a Python module
    symbols = _run(["nm", "-C", str(tmp_path / "cuda_optim.o")], ROOT, 60)
    assert "PyInit_" not in symbols
