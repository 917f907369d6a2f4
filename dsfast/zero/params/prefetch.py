"""ZeRO stage 3 over gloo collectives: gather the coming modules' parameters while the current module computes.

The coordinator (param_hooks.py) has two Prefetchers, one for forwards and one for backwards, and tells each which
module gathers at each step of its pass (a backward's order is its modules' pre-backward hooks, as they fire).
The order of the last pass is kept as a trace; during the next pass, when the module at position k of the trace starts,
the all-gathers of the modules after it are launched (async, one collective a module) and those modules then only
wait for theirs. How far ahead is DeepSpeed's budget: modules are launched in trace order while fewer than
stage3_prefetch_bucket_size elements are in flight (so at least the next one; 0 turns prefetching off), and a launch
that would take the elements in flight plus the running module's past stage3_max_live_parameters waits. A forward
that leaves the trace (the first one, an eval forward down other branches) stops prefetching for the rest of that
forward; every rank runs the same modules in the same order, so every rank launches the same collectives.
Whatever was prefetched but not used is waited for and freed when the forward ends. Same-host ranks gathering out
of shared memory (shared_params.py) have nothing to hide and do not prefetch.
"""
from ...comm.where import at_work, done
from .partitioned_param import SHARDED, launch_coalesced, unpack_coalesced


class Flight:
    """An all-gather in progress for some records (their `full` buffers are being filled)."""

    def __init__(self, recs):
        self.recs = recs
        if len(recs) == 1:
            self.handle, self.out, self.total = recs[0]._launch(), None, 0
        else:
            _, self.handle, self.out, self.total = launch_coalesced(recs)
        for r in recs:
            r.prefetched(self)

    def finish(self):
        """Wait; the records' values are then in `full` (not yet published as param.data)."""
        if self.handle is None:
            return
        self.handle.wait()
        if self.out is not None:
            unpack_coalesced(self.recs, self.out, self.total)
        self.handle = self.out = None
        for r in self.recs:
            r.prefetched(None)


# DeepSpeed's defaults for stage3_prefetch_bucket_size and stage3_max_live_parameters (elements)
DEFAULT_BUCKET, DEFAULT_MAX_LIVE = 50_000_000, 1_000_000_000


class Prefetcher:
    def __init__(self, records_of, enabled, bucket=DEFAULT_BUCKET, max_live=DEFAULT_MAX_LIVE):
        self.records_of = records_of   # module -> its records (param_hooks._records)
        self.enabled = enabled and bucket > 0
        self.bucket, self.max_live = bucket, max_live
        self.trace, self.seen = [], []
        self.flights = []
        self.ahead = 0                 # the next trace position not yet considered for a launch
        self.launches = 0              # all-gathers launched ahead of use, ever (for tests and reports)
        self.active = self.on = False

    def begin_pass(self):
        self.active = True
        self.seen = []
        self.ahead = 0
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
        running = sum(r.numel for r in self.records_of(module))
        self.flights = [f for f in self.flights if f.handle is not None]   # the others were used (gather finished them)
        in_flight = sum(r.numel for f in self.flights for r in f.recs)
        self.ahead = max(self.ahead, k + 1)
        while self.ahead < len(self.trace) and in_flight < self.bucket:
            todo = [r for r in self.records_of(self.trace[self.ahead])
                    if r.state is SHARDED and r.shared is None and r.world > 1]
            size = sum(r.numel for r in todo)
            if todo and in_flight + size + running > self.max_live:
                break          # considered again when the next module starts
            if todo:
                self.flights.append(Flight(todo))
                self.launches += 1
                in_flight += size
            self.ahead += 1

    def end_pass(self):
        if not self.active:
            return
        self.active = self.on = False
        self.trace, self.seen = self.seen, []
        waits = [f for f in self.flights if f.handle is not None]
        if waits:
            at_work(("gather", [r for f in waits for r in f.recs]))
        for f in self.flights:
            f.finish()
            for r in f.recs:
                if r.ready:   # prefetched, never used: let it go
                    r.drop_prefetch()
        self.flights = []
        if waits:
            done()
