"""What the NVMe tests share: a small real filesystem to run out of room on, and a filesystem refusing O_DIRECT."""
import contextlib
import errno
import os
import subprocess

import pytest

from dsfast.zero.nvme import io as nvme_io


@contextlib.contextmanager
def mounted_tmpfs(where, options):
    """A tmpfs mounted at `where` (created) with mount `options` ("size=64k", "ro,size=64k"); skips the test where
    mounting is not allowed (it needs root)."""
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip(f"mounting a tmpfs ({options}) needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def refuse_o_direct(monkeypatch):
    """nvme_io's opens fail with EINVAL when they ask for O_DIRECT, as on a filesystem without direct I/O."""
    real_open = os.open

    def no_direct(path, flags, mode=0o777):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)
    monkeypatch.setattr(nvme_io.os, "open", no_direct)
