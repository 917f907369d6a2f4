"""Checkpoint errors: each names the file, key, rank or tag at fault."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded (the message says which file / key / rank and why)."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is truncated, corrupted or does not match its manifest (the message names the file)."""


class CheckpointTimeoutError(CheckpointError):
    """Other ranks did not reach the same checkpoint step within checkpoint.timeout_s."""


class UnsafeStateError(CheckpointError, TypeError):
    """client_state (or a scheduler state) holds a value that cannot be stored without pickling."""


# The same mistakes raise DeepSpeed's exception types too (programs and tests catch those), with dsfast's message.
class CheckpointDirError(CheckpointError, ValueError):
    """save_checkpoint() without a usable save_dir (DeepSpeed 0.19.8 raises ValueError)."""


class CheckpointTagMismatchError(CheckpointError, AssertionError):
    """Ranks passed different tags under checkpoint.tag_validation "Fail" (DeepSpeed 0.19.8 asserts)."""
