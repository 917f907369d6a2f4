"""Where this process is: the collective it waits in and the call that issued it, for the hang watch.

The hot path only stores references and bumps a counter (no string is built): `at(what)` before a blocking
collective or rendezvous, `done()` after it; the engine sets `WHERE.site` and its counters at each call. `what` is a
tuple (kind, detail...) whose details may be objects (stage 3's parameter records, a gradient bucket); hang_report
turns it into words only when the watch publishes it (a few times a minute) or reports a hang.

`seq` counts the collectives this rank entered: ranks that agree enter the same ones in the same order, so two ranks
waiting with the same seq and `what` are in the same collective (one is merely slower), and differing ones are not.
A collective that raises leaves `inside` set: the report then says where the rank failed.

A collective that returns before it finishes (every one on NCCL: it is queued on a stream and the host blocks later,
in a `.item()` or a sync, with `inside` False; async_op=True anywhere) is recorded by `issued(work, what)`: one tuple
in a dict keyed by a counter (the newest RING kept; the watch drops finished ones at each poll), no string, no
lock. The watch thread asks the recorded works `is_completed()` and takes the oldest that is not as where the rank
waits.
`wait_now(work, what)` records a collective the caller needs finished at once, and waits for it.
"""
import os


class Where:
    __slots__ = ("seq", "inside", "what", "site", "step", "micro", "forwards", "backwards", "evals", "training",
                 "issued", "works")

    def __init__(self):
        self.seq = 0           # collectives entered so far
        self.inside = False    # waiting in one now
        self.what = None       # the last one's tag: (kind, detail...)
        self.site = None       # the dsfast call that issued it: "forward", "backward", "step", "save_checkpoint", ...
        self.step = 0          # engine.global_steps when the call began
        self.micro = 0         # engine.micro_steps when the call began
        self.forwards = 0      # engine.forward calls so far
        self.backwards = 0     # engine.backward calls so far
        self.evals = 0         # engine.forward calls in eval mode so far
        self.training = True   # the module's mode at the last forward
        self.issued = 0        # collectives recorded by issued() so far
        self.works = None      # {issued index: (work, what, seq)}, the newest RING; None: no watch runs, none kept


WHERE = Where()
# recorded works kept: on NCCL a rank queues collectives before its host blocks, so a hang deeper than this is named
# by the oldest of the last RING; more would hold more finished collectives' buffers until the watch's next poll
RING = 16

# DSFAST_HANG_WATCH_NCCL_SHAPE=1 (the tests, on gloo): waits on work handles are not tagged with at(), as on NCCL,
# where they return at once; the watch then knows where a rank waits only from the works issued() recorded
NCCL_SHAPE_ENV = "DSFAST_HANG_WATCH_NCCL_SHAPE"
HOST_WAITS = True


def nccl_shape(env=None):
    """Whether $DSFAST_HANG_WATCH_NCCL_SHAPE asks for the NCCL shape ("1") or not ("0" or unset)."""
    text = (os.environ if env is None else env).get(NCCL_SHAPE_ENV, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{NCCL_SHAPE_ENV}={text!r}: give 1 (the hang watch sees collectives only through their "
                         "work handles, as on NCCL) or 0 (the default)")
    return text == "1"


def at(what):
    """Entering a blocking collective tagged `what` (a tuple; formatted only when reported)."""
    w = WHERE
    w.seq += 1
    w.what = what
    w.inside = True


def done():
    WHERE.inside = False


def call(site, step, micro):
    """A dsfast call that may issue collectives began (engine.step, save_checkpoint, ...)."""
    w = WHERE
    w.site = site
    w.step = step
    w.micro = micro


class waiting:
    """`with waiting(what):` around a blocking collective outside the hot path (setup, checkpoints, exit)."""
    __slots__ = ("what",)

    def __init__(self, *what):
        self.what = what

    def __enter__(self):
        at(self.what)

    def __exit__(self, kind, value, tb):
        if kind is None:
            done()


def forward(step, micro, training):
    """engine.forward began (counted: ranks that ran different numbers of forwards are told apart by it)."""
    w = WHERE
    w.site = "forward"
    w.step = step
    w.micro = micro
    w.forwards += 1
    w.training = training
    if not training:
        w.evals += 1


def backward(step, micro):
    w = WHERE
    w.site = "backward"
    w.step = step
    w.micro = micro
    w.backwards += 1


def issued(work, what):
    """A collective tagged `what` was issued and `work` says when it finishes (returned unchanged)."""
    w = WHERE
    w.seq += 1
    works = w.works
    if works is not None and work is not None:
        n = w.issued
        works[n] = (work, what, w.seq)
        works.pop(n - RING, None)
        w.issued = n + 1
    return work


def forget(index):
    """The wait on the work issued() recorded as number `index` (WHERE.issued before that call) returned, on a
    backend whose wait blocks until the collective finished (gloo): drop it. Gloo's reduce-scatter work never says
    is_completed() (torch 2.13), so the watch would take it for unfinished forever."""
    works = WHERE.works
    if works is not None:
        works.pop(index, None)


def at_work(what):
    """Entering a wait on works issued() recorded: a blocking wait like at(), except in the NCCL shape."""
    if HOST_WAITS:
        at(what)


def wait_now(work, what):
    """Record a collective the caller needs finished now, and wait for it."""
    issued(work, what)
    at_work(what)
    work.wait()
    done()


def pending(failed=False):
    """(seq, what) of the oldest recorded collective not finished, or None; failed=True (the excepthook, after an
    error): of the oldest that finished with an error instead. Called from the watch's thread: the dict is read by
    key, never iterated, and finished entries are dropped by key (the training thread adds entries meanwhile); the
    newest stays, for a failure to be named by."""
    w = WHERE
    works = w.works
    if works is None:
        return None
    end = w.issued
    for n in range(max(end - RING, 0), end):
        e = works.get(n)
        if e is None:
            continue
        if failed:
            if e[0].is_completed() and _raised(e[0]):
                return e[2], e[1]
        elif not e[0].is_completed():
            return e[2], e[1]
        elif n < end - 1:
            works.pop(n, None)   # finished: let its buffers go
    return None


def _raised(work):
    """Whether a finished work ended in an error (its future re-raises it; Work.exception() is deprecated)."""
    try:
        future = work.get_future()
    except Exception:   # not every work has one (gloo's reduce-scatter, deepspeed.comm's coalesced handles)
        return False
    try:
        future.value()
    except Exception:
        return True
    return False


def position(failed=False):
    """(seq, what) of where this rank waits: the oldest unfinished collective it recorded (everything after it waits
    on it), else the blocking wait it is in (at()); None when it waits on nothing dsfast issued. failed: see
    pending()."""
    p = pending(failed)
    if p is not None:
        return p
    w = WHERE
    inside, seq, what = w.inside, w.seq, w.what
    return (seq, what) if inside else None
