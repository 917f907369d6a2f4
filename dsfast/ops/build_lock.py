"""An inter-process build lock that dies with its holder and never waits forever.

torch's own FileBaton waits forever on a lock file left by a killed build; fcntl.flock is
released by the kernel when the holding process exits, however it exits.
"""
import os
import sys
import time
from contextlib import contextmanager

from . import env
from .errors import DsfastOpLockTimeout


@contextmanager
def build_lock(path, what, timeout):
    """Hold an exclusive flock on `path` for the body; DsfastOpError after `timeout` seconds."""
    import fcntl       # POSIX only; imported here so that importing dsfast.ops never fails
    path = str(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start = time.monotonic()
        told = False
        delay = 0.05
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited >= timeout:
                    raise DsfastOpLockTimeout(
                        f"{what}: gave up after waiting {waited:.0f} s for another process's build "
                        f"(lock file {path} is held by a live process). Wait for it to finish, "
                        f"or raise {env.LOCK_TIMEOUT} (now {timeout:g} s).") from None
                if not told and waited > 5:
                    print(f"[dsfast] {what}: waiting for another process building it "
                          f"(lock {path})", file=sys.stderr, flush=True)
                    told = True
                time.sleep(min(delay, max(0.0, timeout - waited)))
                delay = min(delay * 2, 0.5)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
