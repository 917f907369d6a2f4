"""Every op dsfast knows, by name. The loader, the AOT build and `dsfast report` all read this list."""
from .spec import OpSpec

OPS = {}


def register(spec: OpSpec) -> OpSpec:
    OPS[spec.name] = spec
    return spec

# Each op family registers itself below (one line each).
register(OpSpec(name="cpu_optim", sources=("bindings/cpu_optim.cpp", "bindings/cpu_optim_adam.cpp", "bindings/cpu_optim_adam8bit.cpp", "bindings/cpu_optim_sgd.cpp", "bindings/cpu_optim_one_state.cpp", "cpu/dispatch.cpp", "cpu/isa_scalar.cpp", "cpu/isa_avx2.cpp", "cpu/isa_avx512.cpp", "cpu/isa_avx512bf16.cpp"), reference="dsfast.ops.reference.cpu_optim", frontend="dsfast.ops.native.cpu_optim"))
register(OpSpec(name="cuda_optim", sources=("cuda/adam.cu", "cuda/sgd.cu", "cuda/scale.cu", "cuda/norm.cu", "bindings/cuda_optim.cpp"), reference="dsfast.ops.reference.portable_multi_tensor", frontend="dsfast.ops.native.cuda_optim", with_cuda=True))
