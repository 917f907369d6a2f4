"""deepspeed.ops.op_builder: DeepSpeed's op builders by their names, over dsfast's ops.

DeepSpeed compiles each kernel family through a builder (`CPUAdamBuilder().load()` returns the compiled module;
programs call it to build ops ahead of training, and probe `is_compatible()`). Here a builder stands for the dsfast
op that does that job (dsfast.ops.load: prebuilt, else JIT-built, else its pure-torch reference): load() returns
dsfast's op module, which has dsfast's functions, not DeepSpeed's. A builder of a kernel dsfast does not have
imports, answers is_compatible() False, and refuses load() saying so.
"""
from . import env, loader, prebuilt, status
from .errors import DsfastOpError

# DeepSpeed op name -> the dsfast op that does its work (add a line when dsfast gains a kernel family)
DSFAST_OPS = {"cpu_adam": "cpu_optim", "cpu_adagrad": "cpu_optim", "cpu_lion": "cpu_optim",
              "fused_adam": "cuda_optim"}

# why a DeepSpeed op has no dsfast counterpart, where a program may look for one
_MISSING = {
    "async_io": "dsfast's NVMe offload does its own O_DIRECT I/O (dsfast/zero/nvme/io.py) without an async_io op",
    "gds": "dsfast's NVMe offload does its own O_DIRECT I/O (dsfast/zero/nvme/io.py) without GPUDirect Storage",
}


class OpBuilder:
    """One DeepSpeed op, by DeepSpeed's NAME, answered by dsfast's op (DSFAST_OPS) or refused."""
    NAME = None

    def __init__(self, name=None):
        self.name = name or self.NAME

    @property
    def dsfast_op(self):
        return DSFAST_OPS.get(self.NAME)

    def absolute_name(self):
        return f"deepspeed.ops.{self.NAME}.{self.NAME}_op"

    def is_compatible(self, verbose=False):
        """True when load() works here: dsfast's op is prebuilt or buildable, or its pure-torch reference may
        stand in (unless DSFAST_REQUIRE_OPS=1 forbids that)."""
        if self.dsfast_op is None:
            return False
        state, _ = status.op_status(loader.get_spec(self.dsfast_op))
        return state != status.UNAVAILABLE or env.require_mode() != "1"

    def is_installed(self):
        """True when dsfast's op is prebuilt into this installation (DeepSpeed's installed_ops)."""
        if self.dsfast_op is None:
            return False
        origin, problem = prebuilt.find(self.dsfast_op)
        return bool(origin) and problem is None

    def load(self, verbose=True):
        if self.dsfast_op is None:
            why = _MISSING.get(self.NAME, "it is one of DeepSpeed's kernels that dsfast does not have")
            raise DsfastOpError(f"{type(self).__name__}().load(): DeepSpeed's {self.NAME!r} op is not available in "
                                f"dsfast: {why}. dsfast's ops: "
                                f"{', '.join(f'{k} ({v})' for k, v in sorted(DSFAST_OPS.items()))}")
        return loader.load(self.dsfast_op)

    def jit_load(self, verbose=True):
        return self.load(verbose)

    def __repr__(self):
        return f"{type(self).__name__}(NAME={self.NAME!r}, dsfast op={self.dsfast_op!r})"


def _builder(class_name, op_name):
    return type(class_name, (OpBuilder,), {"NAME": op_name, "__doc__": f"DeepSpeed's {op_name!r} op builder."})


# every builder DeepSpeed 0.19.8 exports from deepspeed.ops.op_builder (CUDA and CPU accelerators)
_BUILDERS = {
    "AsyncIOBuilder": "async_io", "CPUAdagradBuilder": "cpu_adagrad", "CPUAdamBuilder": "cpu_adam",
    "CPULionBuilder": "cpu_lion", "FusedAdamBuilder": "fused_adam", "FusedLambBuilder": "fused_lamb",
    "FusedLionBuilder": "fused_lion", "GDSBuilder": "gds", "PinMemoryBuilder": "pin_memory",
    "QuantizerBuilder": "quantizer", "FPQuantizerBuilder": "fp_quantizer", "TransformerBuilder": "transformer",
    "StochasticTransformerBuilder": "stochastic_transformer", "InferenceBuilder": "transformer_inference",
    "InferenceCoreBuilder": "inference_core_ops", "InferenceCutlassBuilder": "cutlass_ops",
    "RaggedOpsBuilder": "ragged_device_ops", "RaggedUtilsBuilder": "ragged_ops", "RandomLTDBuilder": "random_ltd",
    "SpatialInferenceBuilder": "spatial_inference", "EvoformerAttnBuilder": "evoformer_attn",
    "DeepCompileBuilder": "dc", "UtilsBuilder": "utils", "CCLCommBuilder": "deepspeed_ccl_comm",
    "ShareMemCommBuilder": "deepspeed_shm_comm", "NotImplementedBuilder": "deepspeed_not_implemented",
}
globals().update({cls: _builder(cls, op) for cls, op in _BUILDERS.items()})

ALL_OPS = {op: globals()[cls]() for cls, op in _BUILDERS.items()}


def builder_class(class_name):
    """The builder class of that name (get_accelerator().get_op_builder); an unknown name is an error."""
    if class_name not in _BUILDERS:
        raise ValueError(f"no DeepSpeed op builder named {class_name!r}; the builders are: "
                         f"{', '.join(sorted(_BUILDERS))}")
    return globals()[class_name]


__all__ = ["OpBuilder", "ALL_OPS", "DSFAST_OPS", *_BUILDERS]
