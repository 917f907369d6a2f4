"""deepspeed.runtime.activation_checkpointing: the package DeepSpeed's `deepspeed.checkpointing` comes from. Its
`checkpointing` module is dsfast.checkpointing itself (one module: configure() seen through either name)."""
import sys

from ... import checkpointing

sys.modules[f"{__name__}.checkpointing"] = checkpointing

__all__ = ["checkpointing"]
