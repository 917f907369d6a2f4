"""deepspeed.runtime.pipe: pipeline parallelism's names (module.py). dsfast has no pipeline parallelism."""
from .module import DualPipeVModule, LayerSpec, PipelineError, PipelineModule, TiedLayerSpec  # noqa: F401
