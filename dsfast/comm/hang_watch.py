"""The hang watch: when ranks stop agreeing on what to do next, say which rank is where within `after_s` seconds
instead of waiting for the process group's timeout.

Each rank runs one daemon thread. Every `poll` seconds it publishes this rank's position (where.py, in words:
hang_report.py) and a heartbeat to the store the default process group was built from, through its own
connection (never a collective, so it works while the group is stuck). When this rank has waited in the same
collective for `after_s` (a blocking wait, or the oldest collective it issued that has not finished: NCCL's
shape, where.py), it reads every rank's entry twice, `dead_after` apart, and asks hang_report.verdict:
  - a rank whose heartbeat stopped is dead;
  - a live rank in no collective, or whose collective count moved, is working (merely slower): no verdict;
  - ranks all waiting in the same collective (same count and tag) are slow together: no verdict;
  - anything else (live ranks waiting in different collectives, a dead rank, a rank whose program ended) is a hang.
The first verdict goes to the store; every rank's watch prints it to stderr and ends its process with exit code
HANG_EXIT_CODE (a main thread blocked inside a gloo / NCCL wait cannot be interrupted by an exception, and aborting
the group does not release it). The store's host (rank 0) waits, bounded, until the others have read the verdict.
A collective that fails (a peer's connection closed: it died) raises in the main thread first: the excepthook then
adds which rank is dead to the traceback.

The hot path pays for where.py's attribute writes only: the thread wakes `poll` seconds apart and the store is read
only by a rank that has waited `after_s`.
"""
import datetime
import json
import os
import sys
import threading
import time

import torch.distributed as dist

from . import hang_report
from . import where
from .where import WHERE

HANG_EXIT_CODE = 87
ENV = "DSFAST_HANG_WATCH_S"
DEFAULT_AFTER_S = 30.0
PREFIX = "dsfast/hang/"
VERDICT, SEEN = PREFIX + "verdict", PREFIX + "seen"

_watch = []


def resolve_after_s(config=None, pg_timeout_s=None, env=None):
    """Seconds a rank waits in one collective before the ranks' positions are compared (0: no watch):
    $DSFAST_HANG_WATCH_S > config hang_watch.after_s (hang_watch.enabled false: 0) > 30 s. Never longer than the
    process group's timeout: a value set above it is an error; the default is lowered to half of it."""
    env = os.environ if env is None else env
    text = env.get(ENV, "").strip()
    hw = getattr(config, "hang_watch", None)
    if text:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0 or value == float("inf"):
            raise ValueError(f"{ENV}={text!r}: give the seconds (>= 0) a rank waits in one collective before the "
                             f"ranks' positions are compared (0 = no hang watch; default {DEFAULT_AFTER_S:g})")
        source = ENV
    elif hw is not None and not hw.enabled:
        return 0.0
    elif hw is not None and "after_s" in hw.model_fields_set:
        value, source = float(hw.after_s), "hang_watch.after_s"
    else:
        value, source = DEFAULT_AFTER_S, None
    if value and pg_timeout_s and value >= pg_timeout_s:
        if source is None:
            return pg_timeout_s / 2
        raise ValueError(f"{source}={value:g} s is not below the process group's timeout ({pg_timeout_s:g} s): the "
                         "group would fail first and the watch never report; give a smaller value (or raise "
                         "DSFAST_TIMEOUT_S / DEEPSPEED_TIMEOUT)")
    return value


def _pg_timeout_s():
    try:
        import torch
        pg = dist.distributed_c10d._get_default_group()
        for device in ("cpu", "cuda"):
            try:
                return pg._get_backend(torch.device(device)).options._timeout.total_seconds()
            except Exception:
                continue
    except Exception:
        pass
    return None


def _own_store():
    """A connection of our own to the default group's store (the main thread may be blocked on its own one)."""
    store = dist.distributed_c10d._get_default_store()
    inner = store
    while hasattr(inner, "underlying_store"):
        inner = inner.underlying_store
    if isinstance(inner, dist.TCPStore):
        return dist.TCPStore(inner.host, inner.port, is_master=False, timeout=datetime.timedelta(seconds=30),
                             wait_for_workers=False)
    return store


class Watch(threading.Thread):
    def __init__(self, store, rank, world, after_s, model):
        super().__init__(name="dsfast-hang-watch", daemon=True)
        self.store, self.rank, self.world, self.after_s = store, rank, world, after_s
        self.poll = min(max(after_s / 4, 0.1), 2.0)
        self.dead_after = max(3 * self.poll, after_s / 2, 3.0)   # a heartbeat that stopped this long: dead
        self.model = model
        self.names = None
        self.beat = 0
        self.halt = threading.Event()
        self.finishing = False            # finish() is ending this process with a verdict
        self.lock = threading.Lock()      # the thread and the excepthook share the store connection
        self.failed_at = None             # (seq, tag) of the collective that raised in the main thread

    # ---- the store -------------------------------------------------------------------------------------
    def _names(self):
        if self.names is None:
            self.names = hang_report.param_names(self.model)
        return self.names

    def publish(self, gone=False):
        with self.lock:
            if self.halt.is_set() and not gone:
                return          # stop() published this rank's last entry already
            self.beat += 1
            self.store.set(f"{PREFIX}{self.rank}",
                           hang_report.entry(WHERE, self.beat, self._names(), gone, where.position()))

    def read_all(self):
        keys = [f"{PREFIX}{r}" for r in range(self.world)]
        with self.lock:
            present = [k for k in keys if self.store.check([k])]
            values = self.store.multi_get(present) if present else []
        return {int(k[len(PREFIX):]): json.loads(v) for k, v in zip(present, values)}

    # ---- the thread ------------------------------------------------------------------------------------
    def run(self):
        seq, since, first = None, time.monotonic(), None
        try:
            while not self.halt.wait(self.poll):
                if not dist.is_initialized():   # the program destroyed the group itself: its run is over
                    self.stop()
                    return
                self.publish()
                told = self.told()
                if told:
                    self.finish(told)
                now = time.monotonic()
                pos = where.position()
                if pos is None or pos[0] != seq:
                    seq, since, first = pos and pos[0], now, None
                    continue
                if now - since < self.after_s:
                    continue
                if first is None or now - first[0] < self.dead_after:
                    first = first or (now, self.read_all())
                    continue
                found = hang_report.verdict(first[1], self.read_all(), self.world, self.dead_after)
                first = None
                if found and not self.halt.is_set():
                    with self.lock:
                        found = self.store.compare_set(VERDICT, "", found).decode()
                    self.finish(found)
        except Exception as e:   # the store went away (its host, rank 0, ended): the group's own errors follow
            if not self.halt.is_set() and dist.is_initialized():
                _say(self.rank, f"the hang watch lost the store ({type(e).__name__}: {str(e)[:200]}); it stops")

    def told(self):
        """The verdict some rank's watch wrote, or None."""
        with self.lock:
            return self.store.get(VERDICT).decode() if self.store.check([VERDICT]) else None

    def finish(self, text):
        """Print the verdict and end this process (see the module docstring for why not an exception)."""
        self.finishing = True
        self.halt.set()
        _say(self.rank, f"HangError: {text}. Every rank stops (exit code {HANG_EXIT_CODE}); "
                        f"{ENV} / hang_watch.after_s set how long a rank waits before this check", error=True)
        try:
            # every rank waits (bounded: a dead one never comes) until all have read the verdict: a rank that
            # ended first would fail the others' collectives before their watch read it
            with self.lock:
                self.store.add(SEEN, 1)
            deadline = time.monotonic() + 3 * self.poll + 1.0
            while time.monotonic() < deadline:
                with self.lock:
                    if self.store.add(SEEN, 0) >= self.world:
                        break
                time.sleep(0.05)
            if self.rank == 0:
                time.sleep(0.2)     # the store's host ends last: the others' last reads
        except Exception:
            pass
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(HANG_EXIT_CODE)

    def stop(self, publish=True):
        """The program ends normally: leave the watch (the others will say this rank ended, not that it died)."""
        self.halt.set()
        if not publish:
            return
        try:
            self.publish(gone=True)
        except Exception:
            pass

    def after_failure(self):
        """A collective raised in the main thread (a peer's connection closed, a size mismatch): the verdict another
        rank's watch wrote (then this ends the process as finish does), else every rank's position with the dead
        ones named (heartbeats compared dead_after apart)."""
        self.halt.set()
        before = self.read_all()
        after, deadline = before, time.monotonic() + self.dead_after
        while time.monotonic() < deadline:
            told = self.told()
            if told:
                self.finish(told)
            time.sleep(self.poll / 2)
            after = self.read_all()
        dead, gone, live = hang_report.classify(before, after, self.world)
        dead.pop(self.rank, None)          # this rank's own watch was halted, not dead
        live[self.rank] = json.loads(hang_report.entry(WHERE, self.beat, self._names(), pos=self.failed_at))
        return hang_report.describe(dead, gone, live, self.dead_after)


def _say(rank, text, error=False):
    print(f"[dsfast] {'error' if error else 'warning'}: rank {rank}: {text}", file=sys.stderr, flush=True)


def _excepthook(kind, value, tb):
    watch = _watch[0] if _watch else None
    if watch is not None and watch.finishing and issubclass(kind, Exception):
        # the watch is ending this process with a verdict, and a rank that read it first has ended, failing this
        # rank's collective: the exit code is the verdict's (finish() exits within this wait)
        time.sleep(3 * watch.poll + 2.0)
        os._exit(HANG_EXIT_CODE)
    failed_at = watch is not None and where.position(failed=True)
    if failed_at and not watch.halt.is_set() and issubclass(kind, Exception):
        watch.failed_at = failed_at
        try:
            found = watch.after_failure()
        except Exception:
            found = None
        if found:
            _say(watch.rank, f"a collective failed; where the ranks are: {found}", error=True)
    _previous_hook[0](kind, value, tb)


_previous_hook = [sys.excepthook]


def start(config, model=None):
    """Start this process's watch (once; initialize() calls it) when the default group has more than one rank."""
    if _watch or not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    after_s = resolve_after_s(config, _pg_timeout_s())
    if not after_s:
        return None
    where.HOST_WAITS = not where.nccl_shape()
    WHERE.works = {}     # where.issued() records from now on
    watch = Watch(_own_store(), dist.get_rank(), dist.get_world_size(), after_s, model)
    watch.publish()
    watch.start()
    _watch.append(watch)
    if sys.excepthook is not _excepthook:
        _previous_hook[0] = sys.excepthook
        sys.excepthook = _excepthook
    return watch


# How long stop() waits for the watch's thread to finish a store request in flight (its store's own timeout is 30 s)
JOIN_S = 5.0


def stop(publish=True):
    """Leave the watch and wait (bounded) for its thread to end: the exit teardown calls it once every rank arrived,
    before the group is destroyed, or with publish=False when the program destroyed the group itself (the store's
    host may have exited: nothing to tell). A daemon thread still inside a store request when the interpreter
    finalises aborts the process after a run that succeeded ("terminate called without an active exception")."""
    if _watch:
        watch = _watch.pop()
        watch.stop(publish)
        if watch is not threading.current_thread():
            watch.join(JOIN_S)
            if watch.is_alive():
                _say(watch.rank, f"the hang watch did not end within {JOIN_S:g} s (a store request is still "
                                 "waiting); exiting anyway")
        WHERE.works = None
