"""JIT build of one op into the content-keyed cache, under a lock that never hangs forever."""
import importlib.util
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import abi as abi_mod
from . import cache_key, env, paths, toolchain
from .build_lock import build_lock
from .errors import DsfastOpError

# -O3: torch's JIT adds no optimisation flag. -fopenmp: kernels thread with OpenMP.
# Never -march=native: kernels pick AVX-512/AVX2/scalar at run time, so a cached or
# prebuilt binary stays correct on a different CPU.
BASE_CFLAGS = ("-O3", "-fopenmp")
BASE_CUDA_CFLAGS = ("-O3",)
BASE_LDFLAGS = ("-fopenmp",)

MARKER = "build.json"       # written last: its presence means the build is complete
FAILED = "failed.log"       # the last failed build's output
LOCK = "build.lock"         # our flock; torch's own baton is the file "lock"


@dataclass
class Plan:
    """Everything needed to build or find one op in the cache."""
    spec: object
    root: Path
    sources: list
    cflags: tuple
    cuda_cflags: tuple
    ldflags: tuple
    key: str
    build_dir: Path
    abi: str = ""       # 'stable' / 'classic' for torch-library ops, '' for Python-module ops

    @property
    def ext_name(self):
        # The hash in the module name keeps two builds of one op from colliding in one process.
        return f"{self.spec.name}_{self.key[:12]}"


class BuildFailed(Exception):
    def __init__(self, output, log_path):
        super().__init__(output)
        self.output = output
        self.log_path = log_path


def plan(spec):
    root = paths.csrc_root()
    sources = [root / s for s in spec.sources]
    missing = [str(s) for s in sources if not s.is_file()]
    if missing:
        raise FileNotFoundError(f"source file(s) missing: {', '.join(missing)} (csrc root {root}); "
                                "the installation is incomplete, reinstall dsfast")
    abi = abi_mod.choose() if spec.frontend else ""
    abi_flags = abi_mod.cflags(abi, spec.with_cuda) if abi else ()
    cflags = BASE_CFLAGS + abi_flags + tuple(spec.extra_cflags)
    cuda_cflags = (BASE_CUDA_CFLAGS + tuple(spec.extra_cuda_cflags)) if spec.with_cuda else ()
    key = cache_key.compute(spec, root, cflags, cuda_cflags, BASE_LDFLAGS, abi)
    return Plan(spec, root, sources, cflags, cuda_cflags, BASE_LDFLAGS, key,
                cache_dir_for(spec.name, key, abi), abi)


def cache_dir_for(name, key, abi=""):
    import torch
    # A stable-ABI binary serves every torch from its target on: its folder names no torch version.
    torch_part = f"abi-{abi_mod.STABLE}{abi_mod.STABLE_TARGET[0]}.{abi_mod.STABLE_TARGET[1]}" \
        if abi == abi_mod.STABLE else f"torch{torch.__version__}"
    flavour = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{sys.implementation.cache_tag}-{torch_part}")
    return env.cache_root() / flavour / f"{name}-{key[:16]}"


def cached_info(build_dir):
    """The marker of a completed build, or None."""
    try:
        info = json.loads((Path(build_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not (Path(build_dir) / info.get("file", "")).is_file():
        return None
    return info


def import_built(op_spec, build_dir):
    """Import a completed build from the cache, or None if there is none (or it is unusable)."""
    info = cached_info(build_dir)
    if info is None:
        return None
    try:
        return import_binary(op_spec, info["module"], Path(build_dir) / info["file"])
    except (ImportError, OSError):
        return None     # a corrupt or incompatible binary: rebuild it under the lock


def import_binary(op_spec, module_name, path):
    """The op's module from its binary: a torch library is loaded into torch's operator registry and
    its frontend module returned; a Python extension module is imported as it is."""
    if op_spec.frontend:
        import torch
        torch.ops.load_library(str(path))       # OSError when it does not load
        return importlib.import_module(op_spec.frontend)
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    if spec is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(p):
    """Return the op's module from the cache, building it first if needed (at most once across processes)."""
    module = import_built(p.spec, p.build_dir)
    if module is not None:
        return module
    try:
        p.build_dir.mkdir(parents=True, exist_ok=True)
        probe = p.build_dir / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise DsfastOpError(f"dsfast op {p.spec.name!r}: cannot write its build cache {p.build_dir} ({e}); "
                            f"point {env.CACHE_DIR} at a writable directory") from None
    waiting_since = time.time()
    with build_lock(p.build_dir / LOCK, f"dsfast op {p.spec.name!r}", env.lock_timeout()):
        module = import_built(p.spec, p.build_dir)   # someone built it while we waited
        if module is not None:
            return module
        failed = p.build_dir / FAILED
        if failed.exists() and failed.stat().st_mtime >= waiting_since - 1:
            # Another process failed this exact build while we waited: don't repeat it.
            raise BuildFailed(failed.read_text(errors="replace"), failed)
        stale = p.build_dir / "lock"
        if stale.exists():
            stale.unlink()   # torch's baton from a killed build; we hold the flock, so no one is using it
        return _compile(p, failed)


def _compile(p, failed):
    from torch.utils import cpp_extension
    toolchain.put_ninja_on_path()
    if p.spec.with_cuda:
        _point_torch_at_cuda(cpp_extension)
    print(f"[dsfast] building op {p.spec.name!r} (first use; cached in {p.build_dir})",
          file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        module = cpp_extension.load(
            name=p.ext_name,
            sources=[str(s) for s in p.sources],
            extra_cflags=list(p.cflags),
            extra_cuda_cflags=list(p.cuda_cflags) or None,
            extra_ldflags=list(p.ldflags),
            extra_include_paths=[str(paths.include_dir(p.root))],
            build_directory=str(p.build_dir),
            verbose=env.verbose(),
            with_cuda=p.spec.with_cuda,
            is_python_module=not p.spec.frontend,   # a torch library: torch.ops.load_library loads it
        )
        so_path = Path(module if p.spec.frontend else module.__file__)
        if p.spec.frontend:
            module = importlib.import_module(p.spec.frontend)
    except Exception as e:  # compiler errors arrive as RuntimeError, bad binaries as ImportError
        output = f"{type(e).__name__}: {e}"
        failed.write_text(output)
        raise BuildFailed(output, failed) from None
    seconds = time.monotonic() - started
    print(f"[dsfast] built op {p.spec.name!r} in {seconds:.1f} s", file=sys.stderr, flush=True)
    import torch
    info = {"module": p.ext_name, "file": so_path.name, "key": p.key, "build_seconds": round(seconds, 2),
            "sources": [str(s) for s in p.sources], "cflags": list(p.cflags),
            "cxx": toolchain.cxx_path(), "abi": p.abi, "torch": torch.__version__}
    tmp = p.build_dir / f"{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    os.replace(tmp, p.build_dir / MARKER)            # atomic: readers see all or nothing
    if failed.exists():
        failed.unlink()
    return module


def _point_torch_at_cuda(cpp_extension):
    """torch fixes its CUDA_HOME guess at import; correct it when it is not a real toolkit."""
    home = toolchain.cuda_home()
    if home and cpp_extension.CUDA_HOME != home and not toolchain.is_cuda_home(cpp_extension.CUDA_HOME):
        cpp_extension.CUDA_HOME = home
        os.environ.setdefault("CUDA_HOME", home)


def tail_lines(output, n_tail=20, n_errors=5):
    """The lines a user needs: the first few 'error' lines and the last few lines."""
    # Compiler command lines (thousands of characters of include paths) say nothing useful here.
    lines = [ln.rstrip() for ln in output.splitlines()
             if ln.strip() and " -isystem " not in ln and " -MMD " not in ln]
    errors = [ln for ln in lines if "error" in ln.lower()][:n_errors]
    tail = lines[-n_tail:]
    picked = [ln for ln in errors if ln not in tail] + tail
    return "\n".join("    " + ln[:400] for ln in picked)
