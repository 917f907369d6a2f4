"""deepspeed.profiling.flops_profiler: FLOPs, MACs, parameters and latency of each module of a model's forward.

    flops, macs, params = get_model_profile(model, input_shape=(8, 3, 224, 224))
    prof = FlopsProfiler(model); prof.start_profile(); model(x); prof.print_model_profile(); prof.end_profile()

Also driven by the config's "flops_profiler" section: the engine profiles the forward passes of step `profile_step`
on rank 0 and prints the profile at that step's end (EngineProfile).

Counted: what torch.utils.flop_counter counts (matrix multiplies, convolutions, attention: 2 FLOPs per
multiply-accumulate), per module, during forward only; DeepSpeed's profiler also counts elementwise operations
(activations, norms, additions), a few percent of a transformer's total, so its totals read a little higher.
A module's numbers include its children's; a module type in ignore_list is not listed (its work stays in its
parent's numbers). Latency is wall time of each module's forward (synchronized on CUDA).
"""
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from ...accelerator.cuda import synchronize_if_used
from ...zero.params.partitioned_param import whole_numel

_UNITS = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"), (1, ""), (1e-3, "m"), (1e-6, "u"))


def number_to_string(num, units=None, precision=2):
    """1234567 -> '1.23 M' (DeepSpeed's formatting; units forces one of T G M K m u)."""
    if units is None:
        magnitude, units = next(((m, u) for m, u in _UNITS if num >= m or (u == "" and num == 0)), _UNITS[-1])
    else:
        magnitude = dict((u, m) for m, u in _UNITS).get(units, 1)
    return f"{round(num / magnitude, precision):g} {units}"


def flops_to_string(flops, units=None, precision=2):
    return f"{number_to_string(flops, units, precision)}FLOPS"


def macs_to_string(macs, units=None, precision=2):
    return f"{number_to_string(macs, units, precision)}MACs"


def params_to_string(params, units=None, precision=2):
    units = units.replace("B", "G") if units else units
    return number_to_string(params, units, precision).replace("G", "B").strip()


def duration_to_string(seconds, units=None, precision=2):
    return f"{number_to_string(seconds, units, precision)}s"


class _ModuleStats:
    __slots__ = ("name", "module", "depth", "params", "flops", "duration", "calls", "_t0")

    def __init__(self, name, module, depth):
        self.name, self.module, self.depth = name, module, depth
        self.params = sum(whole_numel(p) for p in module.parameters())
        self.flops, self.duration, self.calls, self._t0 = 0, 0.0, 0, []


class _CountFlops(TorchDispatchMode):
    """Adds each operation's FLOPs (torch.utils.flop_counter's formulas) to every module now in forward."""

    def __init__(self, active):
        super().__init__()
        self.active = active         # the _ModuleStats whose forward is running (outermost first)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None and self.active:
            flops = count(*args, **kwargs, out_val=out)
            for st in {id(s): s for s in self.active}.values():
                st.flops += flops
        return out


_warmed = []


def _warm_up_counting():
    """The first operation under a dispatch mode pays a one-time setup (~1 s): pay it before anything is timed."""
    if not _warmed:
        with _CountFlops([]):
            torch.mm(torch.ones(1, 1), torch.ones(1, 1))
        _warmed.append(True)


class FlopsProfiler:
    def __init__(self, model, ds_engine=None, recompute_fwd_factor=0.0):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"FlopsProfiler(model): a torch.nn.Module is needed, got {type(model).__name__}")
        self.model, self.ds_engine, self.recompute_fwd_factor = model, ds_engine, float(recompute_fwd_factor)
        self.started = False
        self._stats, self._hooks, self._active, self._counter = [], [], [], None

    # ---- start / stop ----------------------------------------------------------------------------------------
    def start_profile(self, ignore_list=None):
        """Count every forward of the model from now on (until stop_profile / end_profile)."""
        if self.started:
            return
        _warm_up_counting()
        ignore = tuple(ignore_list or ())
        self._stats, self._hooks = [], []
        root = self.model
        for name, module in root.named_modules():
            if module is not root and ignore and isinstance(module, ignore):
                continue
            st = _ModuleStats(name, module, name.count(".") + 1 if name else 0)
            self._stats.append(st)
            self._hooks.append(module.register_forward_pre_hook(self._pre(st, module is root)))
            self._hooks.append(module.register_forward_hook(self._post(st, module is root), always_call=True))
        self.started = True

    def stop_profile(self):
        """Stop counting; the numbers so far stay readable."""
        if self._counter is not None:     # stopped inside a forward (an exception left it open)
            self._counter.__exit__(None, None, None)
            self._counter = None
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.started = False

    def reset_profile(self):
        for st in self._stats:
            st.flops, st.duration, st.calls = 0, 0.0, 0

    def end_profile(self):
        """Stop and forget the numbers."""
        self.stop_profile()
        self._stats = []

    def _pre(self, st, is_root):
        def hook(module, args):
            if is_root and self._counter is None:     # counting runs during the model's forward only
                self._active = []
                self._counter = _CountFlops(self._active)
                self._counter.__enter__()
            self._active.append(st)
            synchronize_if_used()
            st._t0.append(time.perf_counter())
        return hook

    def _post(self, st, is_root):
        def hook(module, args, output):
            synchronize_if_used()
            if st._t0:
                st.duration += time.perf_counter() - st._t0.pop()
            st.calls += 1
            if self._active and self._active[-1] is st:
                self._active.pop()
            if is_root and self._counter is not None and not st._t0:
                counter, self._counter = self._counter, None
                counter.__exit__(None, None, None)
        return hook

    # ---- totals ----------------------------------------------------------------------------------------------
    def _root(self):
        return next((st for st in self._stats if st.module is self.model), None)

    def get_total_flops(self, as_string=False):
        total = self._root().flops if self._root() else 0
        return number_to_string(total) if as_string else total

    def get_total_macs(self, as_string=False):
        total = self.get_total_flops() // 2
        return macs_to_string(total) if as_string else total

    def get_total_duration(self, as_string=False):
        total = self._root().duration if self._root() else 0.0
        return duration_to_string(total) if as_string else total

    def get_total_params(self, as_string=False):
        total = sum(whole_numel(p) for p in self.model.parameters())
        return params_to_string(total) if as_string else total

    # ---- reports ---------------------------------------------------------------------------------------------
    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True, output_file=None):
        """The summary, the top modules at each depth and (detailed) every module's numbers."""
        out = open(output_file, "w") if output_file else sys.stdout
        try:
            self._print(out, profile_step, module_depth, top_modules, detailed)
        finally:
            if output_file:
                out.close()

    def _print(self, out, profile_step, module_depth, top_modules, detailed):
        flops, params, fwd = self.get_total_flops(), self.get_total_params(), self.get_total_duration()
        line = "-" * 100
        w = lambda *a: print(*a, file=out)   # noqa: E731
        w(f"\n{line}\n---------------------------------- dsfast Flops Profiler ----------------------------------")
        w(f"Profile Summary at step {profile_step}:")
        w("Counted: matrix multiplies, convolutions and attention (torch.utils.flop_counter), forward only.\n")
        w(f"{'params per device:':<60}{params_to_string(params)}")
        w(f"{'fwd MACs per device:':<60}{macs_to_string(flops // 2)}")
        w(f"{'fwd flops per device:':<60}{number_to_string(flops)}")
        w(f"{'fwd latency:':<60}{duration_to_string(fwd)}")
        if fwd > 0:
            w(f"{'fwd FLOPS per device = fwd flops per device / fwd latency:':<60}{flops_to_string(flops / fwd)}")
        engine = self.ds_engine
        iteration = getattr(engine, "_profile_iteration_s", None) if engine is not None else None
        if iteration:
            # forward, backward (2x forward), the recomputed share of forward; for every micro-batch of the step
            factor = (3 + self.recompute_fwd_factor) * engine.gradient_accumulation_steps()
            w(f"{'iter latency (all micro-batches, fwd + bwd + step):':<60}{duration_to_string(iteration)}")
            w(f"{'FLOPS per device = (3 + recompute) * fwd flops * gas / iter:':<60}"
              f"{flops_to_string(factor * flops / iteration)}")
            w(f"{'samples/second:':<60}{engine.train_batch_size() / iteration:.2f}")
        w(self._aggregated(module_depth, top_modules))
        if detailed:
            w("\n------------------------------ Detailed Profile per Module ------------------------------")
            w("Each module: params, MACs, % of total MACs, latency, % of total latency, FLOPS (children included)\n")
            for st in self._stats:
                if module_depth >= 0 and st.depth > module_depth:
                    continue
                share = 100.0 * st.flops / flops if flops else 0.0
                lat = 100.0 * st.duration / fwd if fwd else 0.0
                rate = flops_to_string(st.flops / st.duration) if st.duration > 0 else "0 FLOPS"
                label = st.name or "(model)"
                w(f"{'  ' * st.depth}{label} ({type(st.module).__name__}): {params_to_string(st.params)} params, "
                  f"{macs_to_string(st.flops // 2)} {share:.2f}% MACs, {duration_to_string(st.duration)} "
                  f"{lat:.2f}% latency, {rate}")
        w(line)

    def print_model_aggregated_profile(self, module_depth=-1, top_modules=1):
        print(self._aggregated(module_depth, top_modules))

    def _aggregated(self, module_depth, top_modules):
        depths = sorted({st.depth for st in self._stats})
        if module_depth >= 0:
            depths = [d for d in depths if d <= module_depth]
        lines = ["\n----------------------------- Aggregated Profile per Device -----------------------------",
                 f"Top {top_modules} modules in terms of params, MACs or fwd latency at different model depths:"]
        for d in depths:
            at = [st for st in self._stats if st.depth == d]
            by = lambda key: {type(s.module).__name__ + (f" ({s.name})" if s.name else ""): key(s)  # noqa: E731
                              for s in sorted(at, key=key, reverse=True)[:top_modules]}
            lines.append(f"depth {d}:")
            lines.append(f"    params      - {({k: params_to_string(v) for k, v in by(lambda s: s.params).items()})}")
            lines.append(f"    MACs        - {({k: macs_to_string(v // 2) for k, v in by(lambda s: s.flops).items()})}")
            lines.append(f"    fwd latency - "
                         f"{({k: duration_to_string(v) for k, v in by(lambda s: s.duration).items()})}")
        return "\n".join(lines)


def get_model_profile(model, input_shape=None, args=None, kwargs=None, print_profile=True, detailed=True,
                      module_depth=-1, top_modules=1, warm_up=1, as_string=True, output_file=None,
                      ignore_modules=None, mode="forward"):
    """(flops, macs, params) of one forward (or generate) of `model` on a tensor of `input_shape` (the model's
    dtype and device) or on args / kwargs, after `warm_up` untimed runs; printed unless print_profile=False."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"get_model_profile(model): a torch.nn.Module is needed, got {type(model).__name__}")
    if mode not in ("forward", "generate"):
        raise ValueError(f"get_model_profile(mode={mode!r}): 'forward' or 'generate'")
    args, kwargs = list(args or []), dict(kwargs or {})
    if input_shape is not None:
        if not isinstance(input_shape, tuple) or not input_shape:
            raise ValueError(f"get_model_profile(input_shape={input_shape!r}): a non-empty tuple is needed")
        first = next(model.parameters(), None)
        args = [torch.empty(input_shape, dtype=first.dtype if first is not None else torch.float32,
                            device=first.device if first is not None else "cpu")]
    if not args and not kwargs:
        raise ValueError("get_model_profile: give input_shape, or args and/or kwargs for the model")
    run = model.generate if mode == "generate" else model
    model.eval()
    with torch.no_grad():
        for _ in range(warm_up):
            run(*args, **kwargs)
        prof = FlopsProfiler(model)
        prof.start_profile(ignore_list=ignore_modules)
        run(*args, **kwargs)
        prof.stop_profile()
    flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
    if print_profile:
        prof.print_model_profile(profile_step=warm_up, module_depth=module_depth, top_modules=top_modules,
                                 detailed=detailed, output_file=output_file)
    prof.end_profile()
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params


class EngineProfile:
    """The config's "flops_profiler" section: on rank 0, the first forward of the step run while global_steps ==
    profile_step (as DeepSpeed: with the default 1 the first step is left out as a warm-up) is profiled, and the
    profile printed when that step ends."""

    def __init__(self, engine, cfg):
        self.engine, self.cfg = engine, cfg
        self.profiler = FlopsProfiler(engine.module, ds_engine=engine, recompute_fwd_factor=cfg.recompute_fwd_factor)
        self.active = False
        self._t0 = None

    def _due(self):
        return self.engine.global_rank == 0 and self.engine.global_steps == self.cfg.profile_step

    def before_forward(self):
        if not self.active and self._due():
            self.active, self._t0 = True, time.perf_counter()
            self.profiler.start_profile()

    def after_forward(self):
        if self.active:
            self.profiler.stop_profile()

    def after_step(self, boundary):
        """Called at the end of engine.step(), before global_steps moves on."""
        if not (self.active and boundary):
            return
        synchronize_if_used()
        self.engine._profile_iteration_s = time.perf_counter() - self._t0
        self.profiler.print_model_profile(profile_step=self.cfg.profile_step, module_depth=self.cfg.module_depth,
                                          top_modules=self.cfg.top_modules, detailed=self.cfg.detailed,
                                          output_file=self.cfg.output_file)
        self.profiler.end_profile()
        self.active = False
