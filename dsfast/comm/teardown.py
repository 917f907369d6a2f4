"""Tear the process group down at exit while every peer is still alive, without waiting forever for one that died.

gloo's backend is destroyed when its last reference goes, and destroy_process_group() alone does not get there
when the engine (or a reference cycle through it) still holds the group: the teardown then happens during
interpreter shutdown at an arbitrary time, and when a peer has already exited gloo can abort the process
("terminate called without an active exception", exit -6) after a clean run. So at exit every rank meets the
others through the store first (bounded), then destroys the group and collects the cycles that hold it, and the
store's host (rank 0) waits, bounded again, until every rank is done with it before it exits.
"""
import atexit
import gc
import os
import sys
import time

import torch.distributed as dist

from . import hang_watch, where

EXIT_TIMEOUT = "DSFAST_EXIT_TIMEOUT_S"
DEFAULT_EXIT_TIMEOUT_S = 30.0
_ARRIVED, _DONE = "dsfast/exit/arrived", "dsfast/exit/done"


def exit_timeout():
    """Seconds a rank waits at exit for its peers (0: no waiting); bad values are an error naming the variable."""
    value = os.environ.get(EXIT_TIMEOUT, "").strip()
    if not value:
        return DEFAULT_EXIT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ValueError(f"{EXIT_TIMEOUT}={value!r} is not valid; give the seconds (>= 0) a rank waits for its "
                         f"peers at exit (default {DEFAULT_EXIT_TIMEOUT_S:g}, 0 = do not wait)")
    return seconds


_registered = []


def register_exit_teardown():
    """Register destroy_at_exit once per process: by init_distributed, and by initialize() for a group the program
    (or a framework: Hugging Face's accelerate on CPU calls torch's init_process_group itself) created, which
    otherwise is torn down during interpreter finalisation and can abort a finished run (exit -6)."""
    if not _registered:
        _registered.append(True)
        atexit.register(destroy_at_exit)


# How long the exit hook lets gloo's worker threads run when the program destroyed the group itself (0.1 s was
# short on a loaded machine: a fresh-clone CI run on 2 busy cores still aborted 1 rank-run in 8, 2026-12-06)
RELEASE_WAIT_S = 0.5


def destroy_at_exit():
    """The atexit hook init_distributed registers. When the program already destroyed the group (a DeepSpeed
    program's last line is often torch.distributed.destroy_process_group()), it only yields the GIL for a moment:
    gloo's worker threads release each finished collective after its caller's wait() returned, and on torch 2.13
    releasing a tensor that has a Python object takes the GIL. A release that comes after the interpreter began
    finalising ends that thread with pthread_exit inside gloo's noexcept loop and aborts the process ("terminate
    called without an active exception") after a run that succeeded; about one run in three of a ZeRO-3 program
    on two CPU ranks did, with DeepSpeed too. Sleeping here, before finalisation, lets those releases happen."""
    if not dist.is_initialized():
        hang_watch.stop(publish=False)   # its thread must not be inside a store request at finalisation
        time.sleep(RELEASE_WAIT_S)
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    failing = getattr(sys, "last_value", None) is not None     # an uncaught exception: its peers need not wait
    try:
        timeout = 0.0 if failing else exit_timeout()
    except ValueError as e:
        _say(rank, f"{e}; not waiting for the other ranks")
        timeout = 0.0
    store = _default_store() if world > 1 else None
    where.call("exit", where.WHERE.step, where.WHERE.micro)
    where.at(("exit",))     # the hang watch tells a rank that left its loop early from one still training
    alive = None if store is None else _meet(store, _ARRIVED, rank, world, timeout, "before tearing the group down")
    hang_watch.stop()       # every rank arrived (or will not): from here a silent rank is not a hang
    where.done()
    try:
        dist.destroy_process_group()
        gc.collect()        # frees the backend now if only unreachable cycles (an engine's hooks) still hold it
    except RuntimeError as e:   # too late to fail the run for it: say so and let the process exit
        _say(rank, f"destroying the process group at exit failed: {e}")
    if alive:
        # only the store's host waits: the others must still reach it to say they are done
        _meet(store, _DONE, rank, alive, timeout if rank == 0 else 0.0, "before closing the store")


def _default_store():
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


def _meet(store, key, rank, world, timeout, why):
    """Count this rank in at `key`, wait up to `timeout` s for `world` ranks; returns how many came (None: the store
    is gone). Never raises."""
    try:
        arrived = store.add(key, 1)
        deadline = time.monotonic() + timeout
        while arrived < world and time.monotonic() < deadline:
            time.sleep(0.02)
            arrived = store.add(key, 0)
    except Exception as e:          # the store's host has gone (rank 0 died or exited): nobody left to wait for
        if timeout > 0:
            _say(rank, f"the store is unreachable at exit ({type(e).__name__}: {e}); not waiting for the other "
                       "ranks")
        return None
    if arrived < world and timeout > 0:
        _say(rank, f"at exit, {arrived} of {world} ranks arrived within {timeout:g} s {why} (a rank died or is "
                   f"still busy); going on without them ({EXIT_TIMEOUT} sets the wait)")
    return min(arrived, world)


def _say(rank, message):
    print(f"[dsfast] warning: rank {rank}: {message}", file=sys.stderr, flush=True)
