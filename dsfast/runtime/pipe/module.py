"""deepspeed.runtime.pipe.module: LayerSpec and TiedLayerSpec build the layers they describe, as DeepSpeed's do;
PipelineModule (and DualPipeVModule) import and can be subclassed, and refuse to be built: dsfast has no pipeline
parallelism (no stage partitioning, no pipeline schedule or engine)."""
import torch

from ...unsupported import refuse

_FEATURE = "pipeline parallelism (deepspeed.pipe)"
_INSTEAD = ("build the model as one torch.nn.Module (e.g. torch.nn.Sequential(*[spec.build() for spec in "
            "layers])) and train it with ZeRO, or run this program with DeepSpeed itself")


class PipelineError(Exception):
    """DeepSpeed's error for a misuse of PipelineModule."""


class LayerSpec:
    """A layer to be built later: typename(*module_args, **module_kwargs)."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not (isinstance(typename, type) and issubclass(typename, torch.nn.Module)):
            raise RuntimeError(f"LayerSpec only supports torch.nn.Module types, got {typename!r}")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs
        dist = torch.distributed
        self.global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else -1

    def __repr__(self):
        args = [repr(a) for a in self.module_args] + [f"{k}={v!r}" for k, v in self.module_kwargs.items()]
        return f"{self.typename.__name__}({', '.join(args)})"

    def build(self, log=False):
        return self.typename(*self.module_args, **self.module_kwargs)


class TiedLayerSpec(LayerSpec):
    """A LayerSpec whose weights (tied_weight_attr) are shared by every layer of the same key."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr=("weight",), **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)


class PipelineModule(torch.nn.Module):
    """DeepSpeed's pipeline-parallel model; building one is refused."""

    def __init__(self, layers=None, num_stages=None, *args, **kwargs):
        refuse(f"{type(self).__name__}(num_stages={num_stages})", _FEATURE, _INSTEAD)


class DualPipeVModule(torch.nn.Module):
    """DeepSpeed's DualPipeV pipeline model; building one is refused."""

    def __init__(self, *args, **kwargs):
        refuse(f"{type(self).__name__}(...)", _FEATURE, _INSTEAD)
