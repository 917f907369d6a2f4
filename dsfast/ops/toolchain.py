"""What this machine can build: C++ compiler, ninja, Python headers, CUDA toolkit/torch/GPU.

Each check returns None when fine, else a one-line reason a user can act on. Nothing here
compiles or imports torch at module import time.
"""
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path


def cxx_path():
    """The C++ compiler torch's cpp_extension will call (it honours $CXX, default c++)."""
    return shutil.which(os.environ.get("CXX", "c++"))


def is_cuda_home(path):
    return bool(path) and Path(path, "bin", "nvcc").exists() and Path(path, "include", "cuda_runtime.h").exists()


def cuda_home():
    """The CUDA toolkit root: $CUDA_HOME/$CUDA_PATH, else the toolkit behind `nvcc` on PATH.

    torch guesses dirname(dirname(which nvcc)), which is wrong when PATH holds a wrapper such as
    /usr/local/bin/nvcc (it would look for headers in /usr/local/include), so we verify each guess.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    candidates = []
    found = shutil.which("nvcc")
    if found:
        candidates += [Path(found).parent.parent, Path(os.path.realpath(found)).parent.parent]
    candidates.append(Path("/usr/local/cuda"))
    candidates += sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    for c in candidates:
        if is_cuda_home(c):
            return str(c)
    return None


def nvcc_path():
    home = cuda_home()
    if home and Path(home, "bin", "nvcc").exists():
        return str(Path(home, "bin", "nvcc"))
    return None


def ninja_path():
    """ninja on PATH, else the binary of the `ninja` pip package (in a venv run without activating it)."""
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja
    except ImportError:
        return None
    candidate = Path(getattr(ninja, "BIN_DIR", ""), "ninja")
    return str(candidate) if candidate.is_file() else None


def put_ninja_on_path():
    """torch runs plain `ninja`; make sure that name resolves to the one we found."""
    found = ninja_path()
    if found and shutil.which("ninja") is None:
        os.environ["PATH"] = os.path.dirname(found) + os.pathsep + os.environ.get("PATH", "")


def tool_version(path, flag="--version"):
    """First informative line of `path --version`, or None (for reports, not for cache keys)."""
    if not path:
        return None
    try:
        out = subprocess.run([path, flag], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if not lines:
        return None
    release = [ln for ln in lines if "release" in ln]   # nvcc puts its version on a later line
    return release[0] if release else lines[0]


def cpu_build_problem():
    """Why a C++ op cannot be JIT-built here, or None."""
    if cxx_path() is None:
        return (f"no C++ compiler ({os.environ.get('CXX', 'c++')} not found on PATH; "
                "install g++ or set CXX)")
    if ninja_path() is None:
        return "ninja not found (pip install ninja)"
    include = sysconfig.get_path("include", scheme="posix_prefix")
    if not include or not Path(include, "Python.h").exists():
        return f"Python headers missing (no Python.h in {include}; install python3-dev)"
    return None


def cuda_problem():
    """Why a CUDA op cannot be built or used here, or None."""
    import torch
    if torch.version.cuda is None:
        return f"no CUDA torch (torch {torch.__version__} was built without CUDA)"
    if nvcc_path() is None:
        return "no CUDA toolkit (nvcc not found; set CUDA_HOME)"
    if not torch.cuda.is_available():
        return "no GPU visible (torch.cuda.is_available() is False)"
    return None


def build_problem(spec):
    """Why `spec` cannot be built/used here, or None when a build may be attempted."""
    problem = cpu_build_problem()
    if problem is None and spec.with_cuda:
        problem = cuda_problem()
    return problem


def cpu_isa():
    """CPU instruction-set features relevant to our kernels, from /proc/cpuinfo."""
    wanted = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "avx2", "fma", "f16c")
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return [w for w in wanted if w in flags]
