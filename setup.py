"""dsfast's build: pure Python by default, native ops ahead of time on request.

    pip install .                                              # ops JIT-built on first use
    DSFAST_BUILD_OPS=1 pip install --no-build-isolation .      # ops compiled now (needs torch installed)
    DSFAST_BUILD_OPS=cpu_optim pip install --no-build-isolation .   # only the named ops

torch is never a build requirement: build isolation would install a second, possibly different
torch just to compile against. Only the ahead-of-time mode imports it, lazily, below.
"""
import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
BUILD_OPS = "DSFAST_BUILD_OPS"


class BuildPyWithKernelSources(build_py):
    """Ship csrc/ inside the package (dsfast/csrc) so a wheel can JIT-build its ops."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return          # an editable install builds from the repo's csrc/ directly
        src = HERE / "csrc"
        if not src.is_dir():
            raise RuntimeError(f"kernel sources not found at {src}; the source tree is incomplete")
        dst = Path(self.build_lib) / "dsfast" / "csrc"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("build", "build-*", "*.o", "*.so", "__pycache__"))


def requested_ops():
    value = os.environ.get(BUILD_OPS, "").strip()
    if value in ("", "0"):
        return None
    return "all" if value in ("1", "all") else {v.strip() for v in value.split(",") if v.strip()}


def aot_extensions(wanted):
    """torch extensions for every requested op whose toolchain exists here, plus their build_ext."""
    sys.path.insert(0, str(HERE))       # this tree's dsfast (registry, toolchain), not an installed one
    from dsfast.ops import toolchain
    if toolchain.cuda_home() and not os.environ.get("CUDA_HOME"):
        os.environ["CUDA_HOME"] = toolchain.cuda_home()   # torch's own guess trips on nvcc wrappers
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
    except ImportError:
        sys.exit(f"{BUILD_OPS} needs torch importable while building: install torch first, then run "
                 f"`{BUILD_OPS}=1 pip install --no-build-isolation .`")
    from dsfast.ops import abi, cache_key, jit
    from dsfast.ops.registry import OPS

    if wanted != "all":
        unknown = sorted(wanted - set(OPS))
        if unknown:
            sys.exit(f"{BUILD_OPS}: unknown op(s) {unknown}; registered ops: {sorted(OPS)}")
    extensions, built, digests, abis = [], [], {}, {}
    for name, spec in sorted(OPS.items()):
        if wanted != "all" and name not in wanted:
            continue
        problem = toolchain.cpu_build_problem()
        if problem is None and spec.with_cuda:
            if torch.version.cuda is None:
                problem = f"no CUDA torch (torch {torch.__version__})"
            elif toolchain.nvcc_path() is None:
                problem = "no CUDA toolkit (nvcc not found; set CUDA_HOME)"
        if problem:
            print(f"[dsfast] not prebuilding op {name!r}: {problem}; it will be JIT-built or fall back "
                  "at first use", file=sys.stderr)
            continue
        sources = [f"csrc/{s}" for s in spec.sources]
        op_abi = abi.choose() if spec.frontend else ""
        abi_flags = abi.cflags(op_abi, spec.with_cuda) if op_abi else ()
        args = {"cxx": list(jit.BASE_CFLAGS + abi_flags + tuple(spec.extra_cflags))}
        kind = CppExtension
        if spec.with_cuda:
            args["nvcc"] = list(jit.BASE_CUDA_CFLAGS + tuple(spec.extra_cuda_cflags))
            kind = CUDAExtension
        extensions.append(kind(f"dsfast._ops.{name}", sources, include_dirs=[str(HERE / "csrc" / "include")],
                               extra_compile_args=args, extra_link_args=list(jit.BASE_LDFLAGS)))
        built.append(name)
        digests[name] = cache_key.sources_digest(spec, HERE / "csrc")
        if op_abi:
            abis[name] = op_abi

    class BuildExtWithInfo(BuildExtension):
        """Also record the torch and the sources the ops were compiled from (a mismatch is skipped at load)."""

        def run(self):
            super().run()
            out = (HERE / "dsfast" / "_ops") if self.inplace else Path(self.build_lib) / "dsfast" / "_ops"
            out.mkdir(parents=True, exist_ok=True)
            (out / "build_info.json").write_text(json.dumps({"torch": torch.__version__, "ops": built,
                                                               "sources": digests, "abi": abis}))

    return extensions, BuildExtWithInfo


cmdclass = {"build_py": BuildPyWithKernelSources}
ext_modules = []
wanted_ops = requested_ops()
if wanted_ops is not None:
    ext_modules, cmdclass["build_ext"] = aot_extensions(wanted_ops)

setup(cmdclass=cmdclass, ext_modules=ext_modules)
