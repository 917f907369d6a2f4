"""deepspeed.git_version_info: what DeepSpeed's setup.py records at install time, answered for dsfast.

version    the DeepSpeed API level dsfast implements, as its `deepspeed` alias metadata says
           ("0.19.8+dsfast.<dsfast version>"), so a program's version check sees what it would see installed
git_hash / git_branch   DeepSpeed's "unknown" of an install without git information
installed_ops   DeepSpeed's op names -> True where dsfast's op behind it is prebuilt into this installation
compatible_ops  DeepSpeed's op names -> True where its builder's load() works here (deepspeed.ops.op_builder)
accelerator_name / torch_info   this process's accelerator and torch, in setup.py's shape and spelling
"""
import torch

from .alias_install import VERSION as version
from .ops import op_builder as _op_builder

git_hash = "unknown"
git_branch = "unknown"


def _major_minor(text):
    return ".".join(str(text).split(".")[:2]) if text else "0.0"


def _torch_info():
    cuda = torch.version.cuda if torch.cuda.is_available() or torch.version.cuda else None
    nccl = "0.0"
    if cuda and torch.distributed.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version()[:2])
    return {"version": _major_minor(torch.__version__.split("+")[0]),
            "bf16_support": bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported()),
            "cuda_version": _major_minor(cuda), "nccl_version": nccl,
            "hip_version": _major_minor(getattr(torch.version, "hip", None))}


def _accelerator_name():
    from .accelerator import get_accelerator
    return get_accelerator()._name if hasattr(get_accelerator(), "_name") else get_accelerator().device_name()


torch_info = _torch_info()
installed_ops = {name: builder.is_installed() for name, builder in _op_builder.ALL_OPS.items()}
compatible_ops = {name: builder.is_compatible() for name, builder in _op_builder.ALL_OPS.items()}
accelerator_name = _accelerator_name()

__all__ = ["version", "git_hash", "git_branch", "installed_ops", "compatible_ops", "accelerator_name", "torch_info"]
