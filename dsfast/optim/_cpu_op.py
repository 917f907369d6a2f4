"""What CPUAdam, CPUSGD, CPUAdagrad and CPULion share: the op handle, ISA checks, error relabelling, the per-group
tensor-list cache (with the work table of the eager fast path), and their base class (state
normalisation on load, the step() preamble)."""
import operator
import re
from itertools import chain, repeat

import torch

_INDEX = re.compile(r"__P\[(\d+)\]")
_GRAD = operator.attrgetter("grad")
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def op():
    """The cpu_optim module: native (prebuilt or JIT) or its pure-torch reference."""
    from dsfast.ops import load
    return load("cpu_optim")


def check_isa(isa):
    if not isinstance(isa, str):
        raise TypeError(f"isa must be a string, got {isa!r}")
    if isa == "auto":
        return isa
    valid = ["auto"] + list(op().available_isas())
    if isa not in valid:
        raise ValueError(f"isa={isa!r} cannot run here; this CPU/build supports: {', '.join(valid)}")
    return isa


def num_threads():
    return torch.get_num_threads()


def call(fn, group_index, indices, *args, **kwargs):
    """Call a kernel whose per-tensor errors read '__P[i]', and rewrite them to name the
    parameter as the user knows it: param_groups[g]['params'][j], or, for the flat entry
    points (group_index None), 'the flat partition'."""
    try:
        return fn(*args, label="__P", **kwargs)
    except (ValueError, TypeError) as e:
        if group_index is None:
            msg = _INDEX.sub("the flat partition", str(e))
        else:
            msg = _INDEX.sub(lambda m: f"param_groups[{group_index}]['params'][{indices[int(m.group(1))]}]", str(e))
        raise type(e)(msg) from None


def _same(a, b):
    return len(a) == len(b) and all(map(operator.is_, a, b))


def tables_usable():
    """Whether a step may pass a work table instead of tensor lists: the native op (not the
    reference), eager mode, and no dispatch mode (FakeTensorMode, a schema check...) that must see
    every tensor. torch.compile traces the list ops (their schemas and fake implementations)."""
    return hasattr(op(), "adam_table") and not torch.compiler.is_compiling() \
        and torch._C._len_torch_dispatch_stack() == 0


def check_dense(optimizer, group, j, grad):
    """A sparse gradient (nn.Embedding(sparse=True)) refused by the parameter's name before any kernel runs."""
    if grad.is_sparse:
        gi = next(i for i, pg in enumerate(optimizer.param_groups) if pg is group)
        raise ValueError(f"param_groups[{gi}]['params'][{j}] has a sparse gradient; {type(optimizer).__name__} "
                         "updates dense gradients: use nn.Embedding(..., sparse=False), or torch.optim.SparseAdam "
                         "for that parameter")


def gather(optimizer, group, indices, listed, halves, keys, new_state, check=None):
    """The parameters of one group at `indices` (positions in group["params"]) that have a gradient (listed[k],
    aligned with indices, else p.grad), for a list op: (params, grads, {key: [each one's state[key]]}, outs
    (halves[k] where given), their indices in the group). A parameter without state gets new_state(p) (a dict)
    first; check(j, p, g, state) may refuse one."""
    params, grads, outs, kept = [], [], [], []
    lists = {k: [] for k in keys}
    group_params = group["params"]
    for k, j in enumerate(indices):
        p = group_params[j]
        g = listed[k] if listed is not None else p.grad
        if g is None:
            continue
        check_dense(optimizer, group, j, g)
        state = optimizer.state[p]
        if len(state) == 0:
            state.update(new_state(p))
        if check is not None:
            check(j, p, g, state)
        for key in keys:
            lists[key].append(state[key])
        params.append(p)
        grads.append(g)
        kept.append(j)
        if halves is not None:
            outs.append(halves[k])
    return params, grads, lists, outs, kept


def half_outputs(half_param_groups, group_index, group):
    """The per-parameter 16-bit output buffers for one group (DeepSpeed's fp16_param_groups), or []."""
    if half_param_groups is None:
        return None
    if len(half_param_groups) <= group_index:
        raise ValueError(f"fp16_param_groups has {len(half_param_groups)} entries; param group {group_index} has none")
    entry = half_param_groups[group_index]
    if isinstance(entry, torch.Tensor):
        entry = [entry]
    entry = list(entry)
    if len(entry) != len(group["params"]):
        raise ValueError(f"fp16_param_groups[{group_index}] has {len(entry)} tensors but param group {group_index} "
                         f"has {len(group['params'])} params")
    return entry


class GroupCache:
    """Per param group, the tensor lists of the last step, reused while provably unchanged.

    Gathering 2000 params' states costs milliseconds of Python (Tensor.__hash__ is Python);
    the cache turns that into identity checks. An entry is used only if the group's params
    list is the same object with the same length, the optimizer's state mapping is the same
    object (load_state_dict replaces it), every param has a gradient, and every cached state
    tensor is still the one stored in the param's state. Otherwise the slow path rebuilds it.

    A hit in eager mode then passes one work table (table_step()) instead of the lists: the dispatcher
    converts and frees every list entry, and after the kernel's pass over memory each free is a
    cache miss (~4 ms for the 12000 tensors of a 2000-param Adam step).
    """

    def __init__(self):
        self._entries = {}

    def lookup(self, optimizer, group_index, group, keys):
        """(params, grads, {key: tensors}) or None."""
        e = self._entries.get(group_index)
        plist = group["params"]
        if e is None or e["plist"] is not plist or e["n"] != len(plist) or e["state"] is not optimizer.state \
                or e["keys"] != tuple(keys):
            return None
        # map() with operator functions keeps these loops in C: ~3x cheaper than generators
        grads = list(map(_GRAD, e["params"]))
        if any(map(operator.is_, grads, repeat(None))):
            return None
        # every key of a state in one lookup: after the step's pass over the moments each state dict is a cache
        # miss, and a pass per key paid it per key (20000 params, 5 keys: CPUAdam8bit 37-39 -> 35 ms a step)
        try:
            current = _state_tensors(e["states"], e["keys"])
        except KeyError:
            return None
        if not all(map(operator.is_, current, e["flat"])):
            return None
        return e["params"], grads, e["tensors"]

    def table_step(self, group_index, kind, grads, states, outs, build, step):
        """Run step(table) on the work table of the cached entry with these grads and 16-bit outs;
        False if no table applies (use the list op). build() -> (table, filled outs) runs the list op's
        checks, raising the same errors. A table is rebuilt when a grad or out is another tensor, and when
        step() returns False: the op found a tensor moved (p.data = ..., as ZeRO does) or resized, and
        wrote nothing. Its addresses are checked in C++, which touches each tensor once (after a pass
        over a gigabyte of moments every one is a cache miss: ~1 ms for 10000 tensors, 3 ms in Python)."""
        e = self._entries[group_index]
        t = e.get("table")
        fresh = t is None or t["kind"] != kind or not _same(grads, t["grads"]) or not _same(outs, t["outs"])
        for _ in range(2):
            if fresh:
                t = self._build(e, kind, grads, states, outs, build)
            if t["table"] is None:
                return False
            if step(t["table"]):
                return True
            fresh = True
        return False

    def _build(self, e, kind, grads, states, outs, build):
        table = None
        outs_set = [o for o in outs if o is not None]
        if all(map(_PLAIN.__contains__, map(type, chain(e["params"], grads, *states, outs_set)))):
            table, _ = build()      # (a tensor subclass may not own plain memory: list op)
        e["table"] = dict(kind=kind, grads=grads, outs=list(outs), table=table)
        return e["table"]

    def store(self, optimizer, group_index, group, params, keys):
        plist = group["params"]
        if len(params) != len(plist):      # some params had no grad: don't cache a partial list
            self._entries.pop(group_index, None)
            return
        states = [optimizer.state[p] for p in params]
        keys = tuple(keys)
        flat = _state_tensors(states, keys)     # state by state; each key's list is every len(keys)-th entry
        self._entries[group_index] = dict(plist=plist, n=len(plist), state=optimizer.state, params=list(params),
                                          states=states, keys=keys, flat=flat,
                                          tensors={k: flat[i::len(keys)] for i, k in enumerate(keys)})


def _state_tensors(states, keys):
    """The values of `keys` in each state, state by state, as one list (KeyError if one is missing)."""
    if not keys:            # (SGD without momentum keeps no state)
        return []
    get = operator.itemgetter(*keys)
    return list(map(get, states)) if len(keys) == 1 else list(chain.from_iterable(map(get, states)))


_STATE_TENSORS = ("exp_avg", "exp_avg_sq", "momentum_buffer")


def normalise_state(state):
    """State loaded from elsewhere (an int step, a non-contiguous moment) in the kernel's layout."""
    if not state:
        return
    step = state.get("step")
    if step is not None and not (isinstance(step, torch.Tensor) and step.dtype == torch.float32
                                 and step.device.type == "cpu" and step.numel() == 1):
        state["step"] = torch.tensor(float(step), dtype=torch.float32)
    for key in _STATE_TENSORS:
        t = state.get(key)
        if isinstance(t, torch.Tensor) and not t.is_contiguous():
            state[key] = t.contiguous()


def _skip(parts):
    """A skipped step (found_inf): nothing is read or written."""


class CPUOptimizer(torch.optim.Optimizer):
    """Base of CPUAdam / CPUSGD / CPUAdagrad / CPULion: the ISA choice, the list cache, loading state into the kernel's
    layout, and the closure preamble of step()."""

    _dsfast_amp_step = True   # step(grads=, grad_scale=, found_inf=, clip_coef=, out16=): optim/amp_step.py
    _dsfast_element_wise = True   # each parameter's update reads only its own state: optim/element_wise.py

    def __init__(self, params, defaults, isa, fp32_optimizer_states=True, stochastic_rounding=False):
        self.isa = check_isa(isa)
        # False: the states of a 16-bit parameter (a bf16 / fp16 master) in its own dtype (DeepSpeedCPUAdam's
        # knob; DeepSpeed's bf16_optimizer_states); fp32 parameters keep fp32 states either way
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        # bf16 parameters rounded stochastically (off by default, as DeepSpeed's nearest-even): an update below
        # half a bf16 ulp then moves the parameter on average instead of never. A private generator gives each
        # step its seed, so runs repeat and the global RNG is untouched.
        self.stochastic_rounding = bool(stochastic_rounding)
        self._round_gen = torch.Generator().manual_seed(0x5EED) if self.stochastic_rounding else None
        self._cache = GroupCache()
        super().__init__(params, defaults)

    def round_seed(self):
        """A fresh nonzero seed for one kernel call when stochastic rounding is on, else 0 (nearest even)."""
        if self._round_gen is None:
            return 0
        return int(torch.randint(1, 2 ** 62, (), generator=self._round_gen))

    def state_dtype(self, p):
        """The dtype of p's optimizer states."""
        return torch.float32 if self.fp32_optimizer_states else p.dtype

    def load_state_dict(self, state_dict):
        # torch casts every loaded state to its param's dtype: fp32 states beside a bf16 master would be rounded
        # to bf16. Each state is taken from the saved tensor instead, converted explicitly to this optimizer's
        # state dtype (a bf16-state checkpoint into an fp32-state run and back).
        saved = state_dict.get("state", {})
        saved_ids = [i for g in state_dict.get("param_groups", []) for i in g["params"]]
        super().load_state_dict(state_dict)
        params = [p for g in self.param_groups for p in g["params"]]
        from .quant_state import dequantize_into
        dequantized = 0
        for i, p in zip(saved_ids, params):
            state = self.state.get(p)
            dequantized += dequantize_into(state, saved.get(i, {}), p, self.state_dtype(p),
                                           f"{type(self).__name__}.load_state_dict: state of parameter {i}")
            for key in _STATE_TENSORS:
                original = saved.get(i, {}).get(key)
                if state and isinstance(original, torch.Tensor) and original.is_floating_point():
                    state[key] = original.to(device=p.device, dtype=self.state_dtype(p), copy=True)
            normalise_state(state)
        if dequantized:
            from ..utils.log import logger
            logger.info(f"{type(self).__name__}.load_state_dict: dequantized the 8-bit block-wise exp_avg / "
                        f"exp_avg_sq of {dequantized} parameter(s) to {self.state_dtype(params[0])} states")

    def prepare_amp_step(self, *, grad_scale=None, found_inf=None, clip_coef=None):
        """The per-unit entry (optim/amp_step.py prepare_step): every group's hyperparameters validated once, then
        step(parts) runs the kernels over the parameters parts names (as step(grads=, out16=) would over all)."""
        from .amp_step import host_multiplier
        multiplier = host_multiplier(grad_scale, found_inf, clip_coef)
        if multiplier is None:
            return _skip
        checked = [self._group_hyperparameters(group) for group in self.param_groups]

        def step(parts):
            with torch.no_grad():
                for gi, (group, hparams, (indices, grads, outs)) in enumerate(zip(self.param_groups, checked, parts)):
                    if len(indices):
                        self._step_group(gi, group, hparams, indices, grads, outs, multiplier)
        return step

    def _step_groups(self, multiplier, half_param_groups, grads, keys_of, cached_step):
        """step()'s loop over the groups: a group whose tensors the list cache still holds (GroupCache) is stepped
        by cached_step(gi, group, hparams, params, grads, {key: tensors}, outs, grad multiplier, round seed), which
        takes the work table where it can; any other is gathered and stepped by _step_group, then cached.
        keys_of(hparams): the state keys the cache holds for that group."""
        for gi, group in enumerate(self.param_groups):
            hparams = self._group_hyperparameters(group)
            halves = half_outputs(half_param_groups, gi, group)
            listed = grads[gi] if grads is not None else None
            keys = keys_of(hparams)
            cached = self._cache.lookup(self, gi, group, keys) if listed is None else None
            if cached is None:
                stepped = self._step_group(gi, group, hparams, range(len(group["params"])), listed, halves,
                                           multiplier)
                if stepped and listed is None:
                    self._cache.store(self, gi, group, stepped, keys)
                continue
            params, gs, tensors = cached
            if params:
                scale = -multiplier if group.get("maximize") else multiplier
                cached_step(gi, group, hparams, params, gs, tensors, halves or [], scale, self.round_seed())

    def _group_hyperparameters(self, group):
        """The group's validated hyperparameters (the subclass's checks, flags included)."""
        raise NotImplementedError

    def _step_group(self, gi, group, hparams, indices, grads, outs, multiplier):
        """Step group `gi`'s parameters at `indices` with `grads` / `outs` (aligned with indices; None: p.grad /
        no 16-bit output)."""
        raise NotImplementedError

    @staticmethod
    def _amp_arguments(fp16_param_groups, grad_scale, found_inf, clip_coef, out16):
        """(gradient multiplier or None to skip, the 16-bit output groups) from step()'s amp arguments."""
        from .amp_step import host_multiplier
        if out16 is not None and fp16_param_groups is not None:
            raise TypeError("step(): pass the 16-bit outputs as out16= or fp16_param_groups= (the same thing), "
                            "not both")
        return host_multiplier(grad_scale, found_inf, clip_coef), \
            (out16 if out16 is not None else fp16_param_groups)

    @staticmethod
    def _run_closure(closure):
        if closure is None:
            return None
        with torch.enable_grad():
            return closure()
