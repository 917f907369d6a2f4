"""Synchronous and asynchronous saves. Async: the call copies this rank's state to host memory, agrees with the
other ranks, and returns; a background thread writes and commits. The next save, a load, or the process exit
waits for it (a non-daemon thread), and its error, if any, is raised then. The stall (time inside the call) and the
write time are kept in last_save_stats() and printed by rank 0 for async saves."""
import threading
import time

from . import save as save_mod

_pending = None          # (thread, job, holder) of the save in flight
_last_stats = {}


def last_save_stats():
    """{"tag", "async", "stall_s", "write_s", "bytes"} of this process's last finished (or started) save."""
    return dict(_last_stats)


def wait_pending():
    """Wait for the save in flight; raise its error here if it failed."""
    global _pending
    if _pending is None:
        return
    thread, job, holder = _pending
    _pending = None
    thread.join()
    _last_stats.update(job.stats)
    if holder.get("error") is not None:
        raise holder["error"]


def _async_enabled(engine, override):
    if override is not None:
        return bool(override)
    return bool(getattr(getattr(engine.config, "checkpoint", None), "async_save", False))


def save(engine, save_dir, tag, client_state, save_latest, async_save, exclude_frozen, timeout_s):
    global _pending
    t0 = time.perf_counter()
    wait_pending()
    asynchronous = _async_enabled(engine, async_save)
    job, meeting = save_mod.begin(engine, save_dir, tag, client_state, save_latest, exclude_frozen,
                                  snapshot=asynchronous, timeout_s=timeout_s)
    _last_stats.clear()
    _last_stats.update({"tag": job.tag, "async": asynchronous})
    if not asynchronous:
        path = save_mod.write_and_commit(job, meeting)
        _last_stats.update(job.stats, stall_s=time.perf_counter() - t0)
        return path
    holder = {}

    def run():
        try:
            save_mod.write_and_commit(job, meeting)
        except BaseException as err:   # re-raised by wait_pending in the training thread
            holder["error"] = err
            print(f"[dsfast] rank {job.rank}: asynchronous checkpoint {job.tag!r} failed: {err}", flush=True)

    thread = threading.Thread(target=run, name=f"dsfast-ckpt-{job.tag}", daemon=False)
    thread.start()
    _pending = (thread, job, holder)
    stall = time.perf_counter() - t0
    job.stats["stall_s"] = stall
    _last_stats["stall_s"] = stall
    if job.rank == 0:
        print(f"[dsfast] checkpoint {job.tag!r}: training stalled {stall * 1e3:.1f} ms (host copy + agreement); "
              "files are written in the background", flush=True)
    import os
    return os.path.join(job.save_dir, job.tag)
