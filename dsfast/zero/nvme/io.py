"""Reads and writes of whole swap files from a small thread pool; each call returns a future.

os.preadv / os.pwritev release the GIL, so a few threads keep the disk busy while the caller computes: no libaio,
no op to build, no root. Files are opened with O_DIRECT (the page cache would hold a second copy of states that do
not fit in memory); where the filesystem refuses it the I/O is buffered and a note says so. A write goes to a fresh
file that replaces the old one only once complete, so a failed write (disk full) leaves the previous step's file
intact. Errors name the file and, when the caller gives it, the step.
"""
import errno
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from .buffers import aligned_size

logger = logging.getLogger("dsfast.zero.nvme")

NEW_SUFFIX = ".new"   # a write in progress; renamed over the file once complete


class SwapError(RuntimeError):
    """A swap file could not be read or written (the message names the file and the step)."""


class SwapIO:
    def __init__(self, threads=2, block_size=1 << 20, direct=True):
        """threads: the pool's size (aio.intra_op_parallelism / thread_count); block_size: bytes per pwritev /
        preadv call (aio.block_size); direct=False forces buffered I/O."""
        if int(threads) < 1:
            raise ValueError(f"SwapIO: threads={threads!r}; at least 1 thread is needed")
        if int(block_size) < 1:
            raise ValueError(f"SwapIO: block_size={block_size!r}; give a positive number of bytes")
        self.block_size = aligned_size(block_size)
        self.direct = bool(direct)
        self.notes = []
        self.bytes_read = 0
        self.bytes_written = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=int(threads), thread_name_prefix="dsfast-swap")

    # ---- the caller's side ---------------------------------------------------------------------------------
    def write(self, path, buffer, nbytes, step=None, spare=None):
        """Future of writing the first `nbytes` of `buffer` (nvme_buffers.HostBuffer) as the file `path`.
        spare: the path of a file nobody needs (a retired version of some file), or of none yet: the new bytes
        overwrite it in place, and the file `path` held before becomes the spare (so the disk's blocks are
        reused: a file allocated anew costs ext4 a third of its write bandwidth). On failure `spare` holds the
        partial bytes and `path` is untouched."""
        self._count("bytes_written", nbytes)
        return self._pool.submit(self._guarded, "write", self._write, path, buffer, nbytes, step, spare)

    def read(self, path, buffer, nbytes, step=None):
        """Future of reading `nbytes` of the file `path` into the start of `buffer`."""
        self._count("bytes_read", nbytes)
        return self._pool.submit(self._guarded, "read", self._read, path, buffer, nbytes, step)

    def _count(self, what, nbytes):
        # counted when asked for, so a step's count holds its own transfers even while its last write-back is
        # still in flight when the step ends (a failed transfer raises anyway)
        with self._lock:
            setattr(self, what, getattr(self, what) + aligned_size(nbytes))

    def close(self):
        self._pool.shutdown(wait=True)

    # ---- the pool's side -----------------------------------------------------------------------------------
    def _guarded(self, what, fn, path, buffer, nbytes, step, *more):
        try:
            try:
                return fn(path, buffer, aligned_size(nbytes), *more)
            except OSError as e:
                if not (self.direct and e.errno == errno.EINVAL):
                    raise
                # some filesystems open with O_DIRECT and refuse the transfer itself
                self._fall_back(os.path.dirname(path))
                return fn(path, buffer, aligned_size(nbytes), *more)
        except OSError as e:
            at = f" at step {step}" if step is not None else ""
            kept = "; the file of the previous step is intact" if what == "write" else ""
            err = SwapError(f"NVMe swap {what} of '{path}'{at} failed: {e.strerror or e}{kept}")
            err.path = path   # (the overlapped step names the unit whose file it is)
            err.write = what == "write"   # (a gather meeting the overlapped step's failed write defers it)
            raise err from e

    def _write(self, path, buffer, n, spare=None):
        fresh = path + NEW_SUFFIX
        try:
            if spare is not None and os.path.exists(spare):
                os.rename(spare, fresh)   # its blocks, overwritten in place (a longer tail is never read)
            fd = self._open(fresh, os.O_WRONLY | os.O_CREAT | (0 if spare is not None else os.O_TRUNC))
            try:
                self._transfer(os.pwritev, fd, buffer, n, fresh)
                if os.fstat(fd).st_size > n:   # a larger unit's retired file: its tail would stay on the disk
                    os.ftruncate(fd, n)
            finally:
                os.close(fd)
            if spare is not None and os.path.exists(path):
                os.rename(path, spare)    # the previous version retires as the spare
            os.replace(fresh, path)
        except BaseException:
            if spare is not None and os.path.exists(fresh):
                os.rename(fresh, spare)
            else:
                _remove(fresh)
            raise

    def _read(self, path, buffer, n):
        fd = self._open(path, os.O_RDONLY)
        try:
            self._transfer(os.preadv, fd, buffer, n, path)
        finally:
            os.close(fd)

    def _transfer(self, call, fd, buffer, n, path):
        if n > buffer.nbytes:
            raise ValueError(f"{path}: {n} bytes do not fit a swap buffer of {buffer.nbytes}")
        done = 0
        while done < n:
            want = min(self.block_size, n - done)
            got = call(fd, [buffer.memoryview(done, done + want)], done)
            if got <= 0:
                raise OSError(errno.EIO, f"short {'read' if call is os.preadv else 'write'}: {done} of {n} bytes "
                                         "(the file is truncated or the disk stopped)")
            done += got

    def _open(self, path, flags):
        if self.direct:
            try:
                return os.open(path, flags | os.O_DIRECT, 0o600)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._fall_back(os.path.dirname(path))
        return os.open(path, flags, 0o600)

    def _fall_back(self, directory):
        with self._lock:
            if not self.direct:
                return
            self.direct = False
            note = (f"O_DIRECT is refused on {directory} (tmpfs or a filesystem without direct I/O): NVMe swap "
                    "files go through the page cache instead")
            self.notes.append(note)
            logger.warning(note)


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
