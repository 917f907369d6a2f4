"""Lanes: ordered queues of work beside the main thread, each item's completion an event (the offloaded step's
copies, host step and uploads; issue 28).

    lane = lanes.get("d2h")          # a named lane of this device (made once)
    ev = lane.submit(fn, what)       # fn() runs on the lane after everything submitted to it before
    lane.submit(fn, what, after_current=False)   # CUDA: not ordered after the caller's current stream
    ev.wait()                        # the caller blocks until fn ran; fn's exception is raised here, naming `what`
    ev.query()                       # done already? (never blocks)
    lane.drain()                     # everything submitted so far ran (raises the first failure)

Three kinds, one contract:
  CudaLane    a torch.cuda.Stream: fn() is enqueued on it (after the submitting thread's current stream, so it sees
              what was queued before), the event is a torch.cuda.Event recorded after it. Device work only.
  ThreadLane  a worker thread with a FIFO: fn() runs there; the event is set when it returned. The host step runs on
              one everywhere; on CPU ranks under the test placement the device's copy streams are ThreadLanes too,
              so that every copy really happens later than its submission, as on a GPU.
  InlineLane  fn() runs at once, in the caller (no overlap: the serial path and plain CPU ranks).

Chaos (DSFAST_STREAM_CHAOS=<seed>, DSFAST_STREAM_CHAOS_MS=<max ms, default 3>): every ThreadLane sleeps a random
time from the seed before each item, so that a missing wait reads stale or half-written values and shows up as a
wrong number in CI rather than on a user's GPU. The delays are reproducible per (seed, lane name, item number).
"""
import atexit
import os
import queue
import random
import threading
import time
import weakref

import torch

CHAOS_ENV = "DSFAST_STREAM_CHAOS"
CHAOS_MS_ENV = "DSFAST_STREAM_CHAOS_MS"


class LaneError(RuntimeError):
    """What a lane's item raised, re-raised where its event is waited on."""


def chaos_from_env():
    """(seed, max seconds) of the chaos mode, or None when it is off. A bad value is an error naming the variable."""
    raw = os.environ.get(CHAOS_ENV, "")
    if raw == "":
        return None
    try:
        seed = int(raw)
    except ValueError:
        raise ValueError(f"{CHAOS_ENV}={raw!r}: valid values are an integer seed (chaos delays on) or unset") from None
    raw_ms = os.environ.get(CHAOS_MS_ENV, "3")
    try:
        ms = float(raw_ms)
    except ValueError:
        ms = -1.0
    if not ms >= 0:
        raise ValueError(f"{CHAOS_MS_ENV}={raw_ms!r}: valid values are a number of milliseconds >= 0 (default 3)")
    return seed, ms / 1000.0


class DoneEvent:
    """An event that has happened already (InlineLane's)."""
    def wait(self):
        pass

    def query(self):
        return True


class ThreadEvent:
    def __init__(self, what):
        self.what = what
        self._flag = threading.Event()
        self.error = None

    def set(self, error=None):
        self.error = error
        self._flag.set()

    def query(self):
        return self._flag.is_set()

    def wait(self):
        self._flag.wait()
        if self.error is not None:
            raise LaneError(f"{self.what}: {type(self.error).__name__}: {self.error}") from self.error


class InlineLane:
    name = "inline"

    def submit(self, fn, what="", after_current=True):
        fn()
        return DoneEvent()

    def drain(self):
        pass

    def close(self):
        pass


_open_thread_lanes = weakref.WeakSet()


@atexit.register
def close_thread_lanes():
    """Finish and stop every ThreadLane still open, at exit: a lane thread still inside a native op (a copy, the host
    step) when the interpreter finalises aborts the process ("terminate called without an active exception") after
    a run that succeeded, and an overlapped step left running would be cut off mid-write. (Lanes run no
    collectives, so this may come before or after the process group's own exit teardown.)"""
    for lane in list(_open_thread_lanes):
        lane.close()


class ThreadLane:
    """A worker thread running submitted callables in order. After an item fails, the later ones are not run: their
    events carry the first failure (what ran after a failed copy or step would read wrong values)."""

    def __init__(self, name, chaos=None):
        self.name = name
        self._queue = queue.SimpleQueue()
        self._last = DoneEvent()
        self._failed = None
        self._items = 0
        self._rng = random.Random(f"{chaos[0]}:{name}") if chaos else None
        self._max_delay = chaos[1] if chaos else 0.0
        self._thread = threading.Thread(target=self._run, name=f"dsfast-lane-{name}", daemon=True)
        self._thread.start()
        _open_thread_lanes.add(self)

    def submit(self, fn, what="", after_current=True):
        if not self._thread.is_alive():
            raise RuntimeError(f"lane {self.name!r} is closed: nothing can be submitted to it")
        event = ThreadEvent(what or f"lane {self.name!r} item {self._items}")
        self._items += 1
        delay = self._rng.uniform(0.0, self._max_delay) if self._rng is not None else 0.0
        self._queue.put((fn, event, delay))
        self._last = event
        return event

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, event, delay = item
            if self._failed is not None:
                event.set(self._failed)
                continue
            if delay:
                time.sleep(delay)
            try:
                fn()
            except BaseException as e:   # (handed to the waiter: a lane never dies of its work)
                self._failed = e
                event.set(e)
                continue
            event.set()

    def drain(self):
        self._last.wait()

    def close(self):
        """Run what was submitted, then stop the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        _open_thread_lanes.discard(self)


class CudaEvent:
    def __init__(self, event, what):
        self.event, self.what = event, what

    def query(self):
        return self.event.query()

    def wait(self):
        self.event.synchronize()


class CudaLane:
    def __init__(self, name, device):
        self.name = name
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self._last = DoneEvent()

    def submit(self, fn, what="", after_current=True):
        # after_current: ordered after the submitting thread's current stream (the producer of what fn reads); a
        # worker thread that waited on the producer's event itself passes False
        if after_current:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            fn()
        event = torch.cuda.Event()
        event.record(self.stream)
        self._last = CudaEvent(event, what)
        return self._last

    def drain(self):
        self._last.wait()

    def close(self):
        self.drain()


class Lanes:
    """The lanes of one engine: named, made on first use, closed together. `device_lane(name)` queues device work
    (copies): a CUDA stream on a GPU, a ThreadLane on CPU ranks when `emulate` (the test placement), else inline.
    `host_lane(name)` runs host work (the CPU optimizer) in a worker thread."""

    def __init__(self, device, emulate):
        self.device = torch.device(device)
        self.emulate = emulate
        self.chaos = chaos_from_env()
        self._lanes = {}

    def device_lane(self, name):
        lane = self._lanes.get(name)
        if lane is None:
            if self.device.type == "cuda":
                lane = CudaLane(name, self.device)
            elif self.emulate:
                lane = ThreadLane(name, self.chaos)
            else:
                lane = InlineLane()
            self._lanes[name] = lane
        return lane

    def host_lane(self, name):
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = ThreadLane(name, self.chaos)
        return lane

    def drain(self):
        for lane in list(self._lanes.values()):
            lane.drain()

    def close(self):
        for lane in list(self._lanes.values()):
            lane.close()
        self._lanes.clear()
