"""deepspeed.runtime.checkpoint_engine: the checkpoint engine interface and its torch.save implementation, for
programs that save and load their own files through it (dsfast's engine writes its checkpoints itself)."""
from .checkpoint_engine import CheckpointCommitInfo, CheckpointEngine  # noqa: F401
from .torch_checkpoint_engine import TorchCheckpointEngine  # noqa: F401
