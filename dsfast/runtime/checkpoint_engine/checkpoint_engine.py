"""deepspeed.runtime.checkpoint_engine.checkpoint_engine: what a checkpoint engine provides (create, save, load,
commit, and the defaults DeepSpeed gives the rest)."""
import abc
import os
from dataclasses import dataclass


@dataclass
class CheckpointCommitInfo:
    tag: str
    save_dir: str
    save_latest: bool


class CheckpointEngine(abc.ABC):
    def __init__(self, config_params=None):
        self.name = None

    @abc.abstractmethod
    def create(self, info: CheckpointCommitInfo):
        """A checkpoint `info.tag` is about to be written."""

    @abc.abstractmethod
    def save(self, state_dict, path: str):
        """Write state_dict to path."""

    def makedirs(self, path, exist_ok=False):
        os.makedirs(path, exist_ok=exist_ok)

    @abc.abstractmethod
    def load(self, path: str, map_location=None):
        """What save wrote to path."""

    @abc.abstractmethod
    def commit(self, info: CheckpointCommitInfo):
        """Every file of checkpoint `info.tag` is written; True when it is complete."""

    def is_data_parallel_writer(self, dp_rank):
        return dp_rank == 0

    def is_decoupled(self):
        return False

    def set_commit_info(self, info: CheckpointCommitInfo):
        pass

    def get_commit_info(self):
        return None

    def cleanup(self):
        pass

    def preserves_storage_sharing(self):
        return True
