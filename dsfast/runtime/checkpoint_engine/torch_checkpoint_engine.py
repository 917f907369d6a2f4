"""deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine: files written with torch.save, read with
torch.load (full unpickling, as DeepSpeed's: load only files you trust)."""
import torch

from ...utils import log_dist
from .checkpoint_engine import CheckpointCommitInfo, CheckpointEngine

ENGINE_NAME = "TorchCheckpointEngine"


def _serialization(config):
    if isinstance(config, dict):
        section = config.get("checkpoint") or {}
        return bool(section.get("checkpoint_serialization", True))
    return bool(config.checkpoint.checkpoint_serialization)


class TorchCheckpointEngine(CheckpointEngine):
    def __init__(self, config_params=None):
        """config_params: the engine's config (engine.config, or a ds_config dict; its
        checkpoint.checkpoint_serialization chooses torch.save's zipfile format, default true), or None for the
        legacy format, as DeepSpeed's."""
        super().__init__(config_params)
        self.name = ENGINE_NAME
        self.zipfile_serialization = False if config_params is None else _serialization(config_params)

    def create(self, info: CheckpointCommitInfo):
        log_dist(f"[Torch] Checkpoint {info.tag} is about to be saved!", ranks=[0])

    def save(self, state_dict, path: str):
        torch.save(state_dict, path, _use_new_zipfile_serialization=self.zipfile_serialization)

    def load(self, path: str, map_location=None):
        return torch.load(path, map_location=map_location, weights_only=False)

    def commit(self, info: CheckpointCommitInfo):
        return True
