"""ZeRO stage 3 over gloo collectives: gather the next module's parameters while the current module computes.

The coordinator (param_hooks.py) tells a Prefetcher which module gathers at each step of a forward. The order of
the last forward is kept as a trace; during the next forward, when the module at position k of the trace starts,
the all-gather of the module at k + 1 is launched (async, one collective for its parameters) and that module then
only waits for it. A forward that leaves the trace (the first one, an eval forward down other branches) stops
prefetching for the rest of that forward; every rank runs the same modules in the same order, so every rank
launches the same collectives. Whatever was prefetched but not used is waited for and freed when the forward ends.
Same-host ranks gathering out of shared memory (shared_params.py) have nothing to hide and do not prefetch.
"""
from .partitioned_param import _launch_coalesced, _unpack


class Flight:
    """An all-gather in progress for some records (their `full` buffers are being filled)."""

    def __init__(self, recs):
        self.recs = recs
        if len(recs) == 1:
            self.handle, self.out, self.total = recs[0]._launch(), None, 0
        else:
            _, self.handle, self.out, self.total = _launch_coalesced(recs)
        for r in recs:
            r.flight = self

    def finish(self):
        """Wait; the records' values are then in `full` (not yet published as param.data)."""
        if self.handle is None:
            return
        self.handle.wait()
        if self.out is not None:
            _unpack(self.recs, self.out, self.total)
        self.handle = self.out = None
        for r in self.recs:
            r.flight = None
            r.ready = True


class Prefetcher:
    def __init__(self, records_of, enabled):
        self.records_of = records_of   # module -> its records (param_hooks._records)
        self.enabled = enabled
        self.trace, self.seen = [], []
        self.flights = []
        self.active = self.on = False

    def begin_forward(self):
        self.active = True
        self.seen = []
        self.on = self.enabled and bool(self.trace)

    def visit(self, module):
        """`module` just gathered its own parameters: launch the next module's gather."""
        if not self.active:
            return
        k = len(self.seen)
        self.seen.append(module)
        if not self.on:
            return
        if k >= len(self.trace) or self.trace[k] is not module:
            self.on = False
            return
        if k + 1 < len(self.trace):
            todo = [r for r in self.records_of(self.trace[k + 1])
                    if not r.gathered and r.flight is None and not r.ready and r.shared is None and r.world > 1]
            if todo:
                self.flights.append(Flight(todo))

    def end_forward(self):
        if not self.active:
            return
        self.active = self.on = False
        self.trace, self.seen = self.seen, []
        for f in self.flights:
            f.finish()
            for r in f.recs:
                if r.ready and not r.gathered:   # prefetched, never used: let it go (the storage object stays:
                    r.ready = False               # tensors autograd saved may point at it, see partitioned_param)
                    r.full.untyped_storage().resize_(0)
        self.flights = []
