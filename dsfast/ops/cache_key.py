"""The JIT cache key: everything that changes the built binary, hashed.

Sources' content (the op's files, the headers beside them and every file under csrc/include), the build flags,
the torch ABI (stable: any torch from the target on; classic: this torch's version), Python/CUDA versions, the compiler and the machine architecture. We never build with
-march=native (kernels dispatch on the running CPU), so the architecture is the only ISA input.
"""
import hashlib
import os
import platform
import sys
from pathlib import Path

from . import toolchain

KEY_VERSION = "3"   # bump when the loader changes how it builds


def _file_identity(path):
    """Cheap identity of an executable (no subprocess): resolved path, size, mtime."""
    if not path:
        return "none"
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return real
    return f"{real}:{st.st_size}:{int(st.st_mtime)}"


HEADER_SUFFIXES = {".h", ".hpp", ".cuh", ".inl"}


def source_files(spec, root):
    """The op's sources, the headers in their folders (a kernel's private headers), and csrc/include."""
    root = Path(root)
    files = [root / s for s in spec.sources]
    listed = set(files)
    for folder in sorted({f.parent for f in files}):
        if folder.is_dir():
            files += sorted(p for p in folder.iterdir()
                            if p.is_file() and p.suffix in HEADER_SUFFIXES and p not in listed)
    include = root / "include"
    if include.is_dir():
        files += sorted(p for p in include.rglob("*") if p.is_file())
    return list(dict.fromkeys(files))


def sources_digest(spec, root):
    """Hash of the op's sources and csrc/include alone (a prebuilt op records it to detect edits)."""
    h = hashlib.sha256()
    root = Path(root)
    for path in source_files(spec, root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def compute(spec, root, cflags, cuda_cflags, ldflags, abi=""):
    import torch
    h = hashlib.sha256()

    def add(label, value):
        h.update(f"{label}={value}\n".encode())

    add("key_version", KEY_VERSION)
    add("name", spec.name)
    root = Path(root)
    for path in source_files(spec, root):
        try:
            data = path.read_bytes()
        except OSError as e:
            raise FileNotFoundError(f"op {spec.name!r}: source {path} is missing ({e})") from None
        add("file", path.relative_to(root).as_posix())
        h.update(hashlib.sha256(data).digest())
    add("cflags", cflags)
    add("cuda_cflags", cuda_cflags)
    add("ldflags", ldflags)
    # A stable-ABI binary loads in every torch from its target on (abi.STABLE_TARGET, in the cflags).
    add("abi", abi or "python-module")
    add("torch", "any (stable ABI)" if abi == "stable" else torch.__version__)
    add("python", sys.implementation.cache_tag)
    add("machine", f"{sys.platform}-{platform.machine()}")
    add("cxx", _file_identity(toolchain.cxx_path()))
    if spec.with_cuda:
        add("cuda", torch.version.cuda)
        add("nvcc", _file_identity(toolchain.nvcc_path()))
        add("arch_list", os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
        if torch.cuda.is_available():
            caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
            add("gpus", caps)
    return h.hexdigest()
