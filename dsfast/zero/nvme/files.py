"""Who owns which swap files under `nvme_path`: one directory per job and rank, never another's.

    nvme_path/dsfast-swap/<host>-<pid>-<random>-rank<r>/        this rank's unit files
    nvme_path/dsfast-swap/<host>-<pid>-<random>-rank<r>.lock    flock'ed for the life of the owner

The lock is taken before the directory exists and released after it is gone, so a lock that can be taken means its
owner is gone (exited, or SIGKILLed, which releases the lock with the process): the next start that finds such a
lock removes that directory. A living owner's lock cannot be taken, so its files are never touched. The owner
removes its directory when it closes, and at interpreter exit (normal end or an uncaught exception).
"""
import fcntl
import os
import shutil
import socket
import uuid
import weakref

SWAP_ROOT = "dsfast-swap"
LOCK_SUFFIX = ".lock"


class SwapDir:
    def __init__(self, nvme_path, rank=0):
        self.root = os.path.join(os.path.abspath(nvme_path), SWAP_ROOT)
        os.makedirs(self.root, exist_ok=True)
        self.removed_stale = remove_stale(self.root)
        while True:
            name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}-rank{int(rank)}"
            self.path = os.path.join(self.root, name)
            lock = self.path + LOCK_SUFFIX
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, lock):
                break
            os.close(fd)   # another start took the lock for stale between our create and our flock: a new name
        os.mkdir(self.path, 0o700)
        self._finalizer = weakref.finalize(self, _release, self.path, lock, fd)

    def file(self, name):
        """The path of this owner's swap file `name` (a plain file name: no directories)."""
        if os.sep in name or name in ("", ".", ".."):
            raise ValueError(f"swap file name {name!r}: give a plain file name")
        return os.path.join(self.path, name)

    @property
    def nbytes(self):
        """Bytes of this owner's files on disk now."""
        return sum(e.stat().st_size for e in os.scandir(self.path) if e.is_file())

    @property
    def open(self):
        return self._finalizer.alive

    def close(self):
        """Remove this owner's files and directory, then release its lock (idempotent)."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _release(path, lock, fd):
    shutil.rmtree(path, ignore_errors=True)
    _unlink(lock)
    os.close(fd)   # the lock goes last: nobody may take this directory for stale while it still exists


def remove_stale(root):
    """Remove the directories under `root` whose owner is gone (their lock can be taken); their names."""
    removed = []
    for entry in sorted(os.listdir(root)):
        if not entry.endswith(LOCK_SUFFIX):
            continue
        lock = os.path.join(root, entry)
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:   # its owner (or another cleaner) just removed it
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue   # the owner lives
            if not os.path.exists(lock):   # removed between our open and our lock: already cleaned
                continue
            stale = lock[:-len(LOCK_SUFFIX)]
            shutil.rmtree(stale, ignore_errors=True)
            _unlink(lock)
            removed.append(os.path.basename(stale))
        finally:
            os.close(fd)
    return removed


def _same_file(fd, path):
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
