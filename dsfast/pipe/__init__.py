"""deepspeed.pipe: PipelineModule, LayerSpec, TiedLayerSpec (dsfast.runtime.pipe.module): importable, the specs
work, a pipeline model is refused (dsfast has no pipeline parallelism)."""
from ..runtime.pipe import DualPipeVModule, LayerSpec, PipelineModule, TiedLayerSpec  # noqa: F401

__all__ = ["PipelineModule", "LayerSpec", "TiedLayerSpec", "DualPipeVModule"]
