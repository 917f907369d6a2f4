"""Atomic commit: write under `.tmp-<tag>-<nonce>`, check, rename into place, then move `latest`.

A save killed at any point leaves the previous checkpoint and `latest` as they were: the new folder only appears
(by rename) once complete and checked, and `latest` is replaced by rename after that. Re-saving an existing tag
first renames the old folder aside (`.old-<tag>-<nonce>`); a load finds it there if a kill struck in between.
"""
import os
import shutil
import signal

LATEST = "latest"
ENV_FAULT = "DSFAST_CHECKPOINT_FAULT"   # tests: "<point>[:<rank>]" SIGKILLs this process at that point


def fault_point(point, rank):
    """The kill tests' hook: a real SIGKILL of this rank at a named point of the save."""
    spec = os.environ.get(ENV_FAULT)
    if not spec:
        return
    name, _, who = spec.partition(":")
    if name == point and (who == "" or int(who) == rank):
        os.kill(os.getpid(), signal.SIGKILL)


def tmp_dir(save_dir, tag, nonce):
    return os.path.join(save_dir, f".tmp-{tag}-{nonce}")


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def rename_into_place(tmp, final, nonce, rank=0):
    parent = os.path.dirname(final)
    if os.path.exists(final):
        old = os.path.join(parent, f".old-{os.path.basename(final)}-{nonce}")
        os.rename(final, old)
        fault_point("between_renames", rank)
    os.rename(tmp, final)
    fsync_dir(parent)
    prefix = f".old-{os.path.basename(final)}-"   # this save's aside copy, and any a killed re-save left
    for name in os.listdir(parent):
        if name.startswith(prefix):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def write_latest(save_dir, tag):
    tmp = os.path.join(save_dir, f".{LATEST}.tmp")
    with open(tmp, "w") as f:
        f.write(tag)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(save_dir, LATEST))
    fsync_dir(save_dir)


def read_latest(load_dir):
    path = os.path.join(load_dir, LATEST)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()


def find_checkpoint(load_dir, tag):
    """The folder of `tag`, or the aside copy of a re-save killed between its two renames, or None."""
    final = os.path.join(load_dir, tag)
    if os.path.isdir(final):
        return final
    prefix = f".old-{tag}-"
    try:
        aside = sorted(n for n in os.listdir(load_dir) if n.startswith(prefix))
    except FileNotFoundError:
        return None
    return os.path.join(load_dir, aside[-1]) if aside else None
