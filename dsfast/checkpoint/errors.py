"""Checkpoint errors: each names the file, key, rank or tag at fault."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded (the message says which file / key / rank and why)."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is truncated, corrupted or does not match its manifest (the message names the file)."""


class CheckpointTimeoutError(CheckpointError):
    """Other ranks did not reach the same checkpoint step within checkpoint.timeout_s."""


class UnsafeStateError(CheckpointError, TypeError):
    """client_state (or a scheduler state) holds a value that cannot be stored without pickling."""
