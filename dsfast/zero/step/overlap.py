"""The offloaded host step overlapped with the next forward (zero_optimization.offload_optimizer.overlap_step).

    overlap.submit(optimizer, decision, gather)   # engine.step(): one item per unit on the host lane "step"; returns
    overlap.before_module(module)                 # a forward-pre hook: waits only the units this module uses
    overlap.settle(agree)                         # every unit stepped; a worker failure raised here, on every rank

The decision (decide.py) is taken on the main thread as in the serial step, so every rank knows at once whether the
step applies; the worker then steps unit by unit with the same per-unit entry (optim/amp_step.py prepare_step) and
the same kernels on the same values, so the result is bitwise the serial one. Units go in the order the next
forward first uses them (recorded once by the hooks; before that, the model's parameter order, the reverse of the
reduction's). Each unit's item waits its gradient's event (u.grad_event), steps it, copies its 16-bit values back
(finish_step, waiting the upload) and, at stages 1-2 with several ranks, all-gathers its bucket on a process group of its own (every
rank issues them in the same order, never in the middle of the forward's collectives); u.step_event is its event.
With stage 3's shards on NVMe the item writes the unit's new 16-bit values through the parameters' window (which
the forward's gathers use meanwhile, under its lock: nvme/params.py), and a last item lets every write land, so a
failed one is the step's failure, raised at the settle on every rank.
"""
import threading

import torch
import torch.distributed as dist

from ...accelerator.streams import DoneEvent, LaneError, ThreadEvent
from ...optim.element_wise import element_wise_names
from .apply import count_swap_step, unit_stepper


def per_unit_optimizer_names():
    """The element-wise optimizers that can be stepped unit by unit in a worker (their hyperparameters read once,
    as the step is prepared, so the scheduler's next step cannot reach a unit stepped later)."""
    import dsfast.optim as optim
    return [n for n in element_wise_names() if hasattr(getattr(optim, n, None), "prepare_amp_step")]


class OverlapFailure(RuntimeError):
    """The overlapped host step failed in its worker: raised at the next settle, on every rank."""


class OverlappedStep:
    def __init__(self, store, world, rank, group=None, names=None):
        """store: the unit store (flat_shards.FlatShards, stage3.Stage3Store); group: the owner's group, whose
        ranks get a gather group of their own (stages 1-2, several ranks)."""
        self.store = store
        self.world, self.rank, self.group = world, rank, group
        self.names = names or {}          # id(param) -> qualified name (the owner's prepare_step gives them)
        self.gather_group = None
        self.steps = 0                    # optimizer steps submitted (named in failures)
        self.order = None                 # unit indices in the order the forward first used them
        self._seen = None                 # the first forward's record in progress
        self._failure = None              # (step, unit index, exception) of the first failed item
        self._unagreed = False            # a step was submitted since the ranks last compared failures
        self._remote = None               # another rank's failure, as every later settle raises it
        self._units_of = {}               # id(module) -> units holding its direct parameters
        self._handles = []
        self._failure_lock = threading.Lock()   # (the worker and a gather meeting a failed write both record)
        self._writes_landed = DoneEvent()   # the last step's NVMe write-backs (states' walk, parameters) landed

    def make_gather_group(self):
        """Stages 1-2 with several ranks: a process group for the workers' gathers (a collective: every rank of
        the default group calls it at init, alike)."""
        if self.world > 1:
            ranks = dist.get_process_group_ranks(self.group) if self.group is not None else list(range(self.world))
            if len(ranks) != dist.get_world_size():
                raise ValueError("zero_optimization.offload_optimizer.overlap_step: true needs the data-parallel "
                                 "group to be every rank (model or pipeline parallel groups are not overlapped "
                                 "yet); set it to false")
            self.gather_group = dist.new_group(ranks)

    # ---- the forward's side --------------------------------------------------------------------------------
    def hook(self, model, unit_of, waits, before_forward=None):
        """A forward-pre hook on each module with direct parameters: records the units' first-use order and,
        `waits` (stages 1-2), waits their step. unit_of(param) -> unit or None. before_forward(): run as the
        model's forward starts (stage 3: the refresh of the parameters that stay whole)."""
        def start(mod, args):
            if mod.training and torch.is_grad_enabled():
                self.start_forward()
            if before_forward is not None:
                before_forward()
        self._handles.append(model.register_forward_pre_hook(start, prepend=True))
        self._handles.append(model.register_forward_hook(lambda mod, args, out: self.end_forward(), always_call=True))
        for m in model.modules():
            units = []
            for p in dict.values(m._parameters):   # (stage 3's ZeroParamDict: its values, not a gather)
                u = unit_of(p) if p is not None else None
                if u is not None and all(u is not v for v in units):
                    units.append(u)
            if units:
                self._units_of[id(m)] = units
                self._handles.append(m.register_forward_pre_hook(
                    lambda mod, args, w=waits: self.before_module(mod, w), prepend=True))

    def before_module(self, module, waits=True):
        units = self._units_of.get(id(module), ())
        if self._seen is not None:
            for u in units:
                if u.index not in self._seen:
                    self._seen[u.index] = None
        if waits:
            for u in units:
                self.wait_unit(u)

    def start_forward(self):
        """The first training forward records the order (once)."""
        if self.order is None and self._seen is None:
            self._seen = {}

    def end_forward(self):
        if self._seen is not None and self._seen:
            seen = list(self._seen)
            rest = [u.index for u in self.store.units if u.index not in self._seen]
            self.order = seen + rest
        self._seen = None

    def detach(self):
        """Hooks off and the worker stopped (engine.destroy(); after the settle)."""
        for h in self._handles:
            h.remove()
        self._handles = []
        self.store.lanes.close()

    # ---- the step --------------------------------------------------------------------------------------------
    def units_in_order(self, first=()):
        units = self.store.units
        if self.order is None:   # the model's parameter order (the reverse of the reduction's)
            ordered = sorted(units, key=lambda u: min(e.param for e in u.plan.entries))
        else:
            by_index = {u.index: u for u in units}
            ordered = [by_index[i] for i in self.order]
        if first:   # (stage 3: the units whose parameters stay whole are refreshed first of all)
            keep = {id(u) for u in first}
            ordered = [u for u in ordered if id(u) in keep] + [u for u in ordered if id(u) not in keep]
        return ordered

    def submit(self, optimizer, decision, gather=None, first=()):
        """Queue every unit's update (decision applied) on the host lane; returns at once. gather(unit, group):
        the unit's all-gather after its update (stages 1-2, several ranks)."""
        self.steps += 1
        store = self.store
        count_swap_step(store)   # (the swap's I/O errors name the step, as the serial step's)
        if not decision.applied():   # a skipped step writes nothing (the serial step's kernels skip too)
            return
        step = unit_stepper(store, optimizer, decision)   # (hyperparameters read now, before the scheduler steps)
        lane = store.lanes.host_lane("step")
        n = self.steps
        self._unagreed = True
        units = self.units_in_order(first)
        if store.param_swap is not None:   # a gather meeting this step's failed write leaves it to the settle
            store.param_swap.write_failed = lambda e: self._fail(n, self._unit_of_error(e, units, units[-1]), e)
        if store.swap is not None:
            self._submit_walk(lane, store.swap.step_order(units), n, step, gather)
            return
        for u in units:
            u.step_event = lane.submit(lambda u=u: self._item(u, n, step, gather),
                                       f"optimizer step {n}, {self.unit_name(u)}")
        if store.param_swap is not None:
            self._writes_landed = lane.submit(lambda: self._land_param_writes(n, units),
                                              f"optimizer step {n}: the parameters' NVMe write-backs")

    def _submit_walk(self, lane, units, n, step, gather):
        """States on NVMe: one worker item walks the units through the states' window (read ahead, written
        behind; the window is the worker's alone until the settle), setting each unit's step_event as it is
        stepped; the item's own event says every write landed (the settle waits it)."""
        events = {u.index: ThreadEvent(f"optimizer step {n}, {self.unit_name(u)}") for u in units}
        for u in units:
            u.step_event = events[u.index]
        self._writes_landed = lane.submit(lambda: self._walk(units, events, n, step, gather),
                                          f"optimizer step {n}: the NVMe states' walk")

    @torch.no_grad()
    def _walk(self, units, events, n, step, gather):
        done = 0
        try:
            for u in self.store.swap.windows(units):
                self._item(u, n, step, gather)
                events[u.index].set()   # (before the walk resumes: the unit's eviction waits its step_event)
                done += 1
        except Exception as e:   # an I/O error: named at the unit whose file failed (else where the walk was)
            self._fail(n, self._unit_of_error(e, units, units[min(done, len(units) - 1)]), e)
        finally:
            for u in units[done:]:   # not stepped; their gathers still run (the other ranks wait in them)
                if gather is not None and self._failure is not None:
                    gather(u, self.gather_group)
                events[u.index].set()
            self._land_param_writes(n, units)

    def _land_param_writes(self, n, units):
        """Stage 3's shards on NVMe: every write-back of the step landed, a failed one kept as the step's failure
        (settled here in the worker: a gather settling it would raise it in one rank's forward)."""
        if self.store.param_swap is None:
            return
        try:
            self.store.param_swap.flush()
        except Exception as e:
            self._fail(n, self._unit_of_error(e, units, units[-1]), e)

    def _fail(self, n, unit, e):
        """Keep the step's first failure (n, unit index, exception) for the next settle."""
        with self._failure_lock:
            if self._failure is None:
                self._failure = (n, unit.index, e)

    def _unit_of_error(self, e, units, default):
        """The unit of `units` whose swap file (states or 16-bit shard) an I/O error names, else `default`."""
        path = getattr(e, "path", None)
        if path is None:
            return default
        states, params = self.store.swap, self.store.param_swap
        for u in units:
            if states is not None and states.window.path(u.index) == path:
                return u
            if u.param_swap is not None and params.window.path(params.index[id(u.slice16)]) == path:
                return u
        return default

    @torch.no_grad()
    def _item(self, u, n, step, gather):
        """One unit's update and gather. A failure is kept for the next settle, not raised into the lane: the
        later units' gathers still run (the other ranks' workers wait in them), their updates do not."""
        if self._failure is None:
            try:
                step(u)   # (waits the unit's gradient copy first: apply.py)
            except Exception as e:   # (an I/O error may be an earlier unit's write-back, met as a buffer frees)
                self._fail(n, self._unit_of_error(e, self.store.units, u), e)
        if gather is not None:
            gather(u, self.gather_group)

    def unit_name(self, u):
        names = [self.names.get(id(self.store.params[e.param]), f"parameter {e.param}") for e in u.plan.entries]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        return f"unit {u.index} (parameters {shown})"

    # ---- waiting -------------------------------------------------------------------------------------------------
    @staticmethod
    def wait_unit(u):
        """Unit u stepped. A failure is not raised here (one rank's forward would leave the others waiting in a
        collective): the next settle raises it, on every rank."""
        try:
            u.step_event.wait()
        except LaneError:
            pass

    def wait_all(self):
        for u in self.store.units:
            self.wait_unit(u)
        try:   # (NVMe: every write-back of the step landed, so that readers find the states and shards on disk)
            self._writes_landed.wait()
        except LaneError:
            pass

    def settle(self, agree=False):
        """Every unit stepped. A failure in the worker is raised here; agree=True (a call every rank makes: the
        next backward or step) shares it first, so every rank raises it."""
        self.wait_all()
        if self.store.param_swap is not None:   # (every write of the step landed: none left to defer)
            self.store.param_swap.write_failed = None
        if agree and self.world > 1 and self._unagreed:   # (once per submitted step: every rank submits alike)
            self._unagreed = False
            row = torch.zeros(self.world, 3, dtype=torch.int64)
            if self._failure is not None:
                row[self.rank] = torch.tensor([1, self._failure[0], self._failure[1]])
            dist.all_reduce(row, group=self.group)
            bad = [r for r in range(self.world) if row[r, 0]]
            if bad and self._failure is None:
                r = bad[0]
                unit = self.store.units[int(row[r, 2])] if int(row[r, 2]) < len(self.store.units) else None
                what = self.unit_name(unit) if unit is not None else f"unit {int(row[r, 2])}"
                self._remote = (f"the overlapped optimizer step {int(row[r, 1])} failed on rank {r} at {what} "
                                "(zero_optimization.offload_optimizer.overlap_step): that rank raised the error; "
                                "this engine's parameters are not usable")
        self.raise_failure()

    def raise_failure(self):
        """The failure again at every later settle (the engine's parameters are not usable after it)."""
        if self._remote is not None:
            raise OverlapFailure(self._remote)
        if self._failure is not None:
            n, index, e = self._failure
            raise OverlapFailure(f"the overlapped optimizer step {n} failed on rank {self.rank} at "
                                 f"{self.unit_name(self.store.units[index])} "
                                 f"(zero_optimization.offload_optimizer.overlap_step): {type(e).__name__}: {e}") from e
