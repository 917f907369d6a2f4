"""Where this process is: the collective it waits in and the call that issued it, for the hang watch.

The hot path only stores references and bumps a counter (no string is built): `at(what)` before a blocking
collective or rendezvous, `done()` after it; the engine sets `WHERE.site` and its counters at each call. `what` is a
tuple (kind, detail...) whose details may be objects (stage 3's parameter records, a gradient bucket); hang_report
turns it into words only when the watch publishes it (a few times a minute) or reports a hang.

`seq` counts the collectives this rank entered: ranks that agree enter the same ones in the same order, so two ranks
waiting with the same seq and `what` are in the same collective (one is merely slower), and differing ones are not.
A collective that raises leaves `inside` set: the report then says where the rank failed.
"""


class Where:
    __slots__ = ("seq", "inside", "what", "site", "step", "micro", "forwards", "backwards", "evals", "training")

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


WHERE = Where()


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
