"""The two things the op loader says to users: an error that stops, a warning that doesn't."""


class DsfastOpError(RuntimeError):
    """An op could not be built or loaded and falling back was not allowed.

    The message always names the op, why it failed and which variable to set.
    """


class DsfastOpWarning(UserWarning):
    """An op runs on its pure-torch reference (slower) instead of the native kernel."""


class DsfastOpLockTimeout(DsfastOpError):
    """Another live process held the op's build lock for longer than we may wait (retryable)."""
