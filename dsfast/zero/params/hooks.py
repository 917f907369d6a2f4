"""ZeRO stage 3's module hooks: each module's parameters are whole exactly while its forward or backward runs.

  before forward   gather the module's own parameters and its external ones (refs + 1)
  after forward    refs - 1 and release; when the outputs need gradients, hook them: the first output gradient
                   means the module's backward is about to run, so its parameters are gathered again and held
                   (backward_hold) until their gradients are reduced (the owner releases them, stage3.py)
Under torch.no_grad() / eval nothing is hooked: parameters are gathered and released, never reduced.

External parameters: a module's forward that reads another module's parameter (a tied embedding read by the
model's head, `x @ self.emb.weight.T`) finds it released. Every module's `_parameters` dict is replaced by
ZeroParamDict, whose lookup (what `module.weight` does) gathers such a parameter and registers it on the module
whose forward is running, so it is gathered with that module from then on, in forward and backward (DeepSpeed
does the same with its ZeROOrderedDict). dsfast.zero.register_external_parameter does it explicitly.

Leaf modules (`module._z3_leaf`, set by deepspeed.utils.set_z3_leaf_modules or zero_optimization.leaf_module; read
here, when the hooks are placed): the leaf gathers the parameters of its whole subtree as its own, and the modules
inside it get no hooks. Every rank then gathers the same parameters whatever runs inside (an MoE block whose ranks
route to different experts), where per-module hooks would make the ranks' collectives differ.
"""
import torch

from ...utils.nested import nested_tensors
from .partitioned_param import gather, record_of
from .placeholders import PartitionedPlaceholder, refuse_placeholders
from .prefetch import DEFAULT_BUCKET, DEFAULT_MAX_LIVE, Prefetcher

_ACTIVE = []         # modules whose forward is running, innermost last
CONSTRUCTION = []    # zero.Init's window while a module's __init__ runs under it (init.py), else empty


class ZeroParamDict(dict):
    """module._parameters that gathers a released parameter read during another module's forward (and, under
    zero.Init, one read while a module is being built: init.py)."""
    leaf = None   # the leaf module whose subtree holds this dict's module: its parameters are that leaf's own

    def items(self):
        if CONSTRUCTION:
            CONSTRUCTION[-1].touch(self, [p for p in dict.values(self) if p is not None])
        return dict.items(self)

    def __getitem__(self, key):
        p = dict.__getitem__(self, key)
        if CONSTRUCTION and p is not None:
            CONSTRUCTION[-1].touch(self, [p])
        if _ACTIVE and p is not None:
            rec = getattr(p, "_dsfast_z3", None)
            active = _ACTIVE[-1]
            if rec is not None and active.__dict__.get("_parameters") is not self and self.leaf is not active:
                _add_external(active, rec)
        return p


def _add_external(module, rec):
    ext = module.__dict__.setdefault("_dsfast_external", [])
    if any(r is rec for r in ext):
        if not rec.gathered:
            gather([rec])
        return
    ext.append(rec)
    if any(m is module for m in _ACTIVE):   # inside its forward: held until that forward ends
        rec.refs += 1
    gather([rec])


def _keep_returned_parameters(outputs):
    """A forward that returns a parameter (a layer handing back its bias for the caller to add, as DeepSpeed's
    test_ext_param_return and Megatron's skip_bias_add do): the caller uses it after this module's forward ends, so
    it becomes an external parameter of the calling module, whole until that module's forward ends and gathered
    with it from then on (DeepSpeed registers it the same way)."""
    for t in outputs:
        rec = record_of(t)
        if rec is not None and not any(any(r is rec for r in m.__dict__.get("_dsfast_external", ()))
                                       for m in _ACTIVE):
            _add_external(_ACTIVE[-1], rec)


def _check_parameter(what, parameter):
    if not isinstance(parameter, torch.nn.Parameter):
        raise RuntimeError(f"{what}: the parameter must be a torch.nn.Parameter, got {type(parameter).__name__}")


def register_external_parameter(module, parameter):
    """Gather `parameter` whenever `module` runs (DeepSpeed's deepspeed.zero.register_external_parameter). A
    parameter that is not partitioned is remembered (so that unregistering it works) and needs no gathering."""
    _check_parameter("register_external_parameter", parameter)
    module.__dict__.setdefault("_dsfast_external_ids", set()).add(id(parameter))
    rec = record_of(parameter)
    if rec is None:
        return
    ext = module.__dict__.setdefault("_dsfast_external", [])
    if not any(r is rec for r in ext):
        ext.append(rec)


def unregister_external_parameter(module, parameter):
    """Undo register_external_parameter: `module` no longer gathers `parameter` when it runs."""
    _check_parameter("unregister_external_parameter", parameter)
    registered = module.__dict__.get("_dsfast_external_ids", set())
    if id(parameter) not in registered:
        raise RuntimeError(f"unregister_external_parameter: the parameter (shape {tuple(parameter.shape)}) is not a "
                           f"registered external parameter of this {type(module).__name__}")
    registered.discard(id(parameter))
    rec = record_of(parameter)
    if rec is not None:
        module.__dict__["_dsfast_external"] = [r for r in module.__dict__.get("_dsfast_external", []) if r is not rec]


def _records(module):
    out, seen = [], set()
    for m in module.__dict__.get("_dsfast_leaf_subtree", (module,)):
        for p in dict.values(m._parameters):
            rec = record_of(p) if p is not None else None
            if rec is not None and id(rec) not in seen:
                seen.add(id(rec))
                out.append(rec)
    for rec in module.__dict__.get("_dsfast_external", ()):
        if id(rec) not in seen:
            seen.add(id(rec))
            out.append(rec)
    return out




class ParamCoordinator:
    """Installs the hooks on every module of `model`; detach() removes them."""

    def __init__(self, model, prefetch=False, prefetch_bucket=DEFAULT_BUCKET, max_live=DEFAULT_MAX_LIVE):
        """prefetch: launch the coming modules' all-gathers while a module runs (gloo path), within DeepSpeed's
        stage3_prefetch_bucket_size and stage3_max_live_parameters (elements; prefetch.py)."""
        self.model = model
        self.prefetcher = Prefetcher(_records, prefetch, prefetch_bucket, max_live)
        self.backward_prefetcher = Prefetcher(_records, prefetch, prefetch_bucket, max_live)
        self.handles = []
        inside = _leaf_subtrees(model)   # module id -> the (outermost) leaf module it is inside of
        for m in model.modules():
            if not isinstance(m._parameters, ZeroParamDict):
                m._parameters = ZeroParamDict(m._parameters)
            m.__dict__["_dsfast_z3_hooked"] = True
            leaf = inside.get(id(m))
            m._parameters.leaf = leaf
            if leaf is None or leaf is m:   # (nothing inside a leaf is hooked)
                self.handles.append(m.register_forward_pre_hook(self._pre_forward))
                self.handles.append(m.register_forward_hook(self._post_forward, always_call=True))
            if any(record_of(p) is not None for p in dict.values(m._parameters) if p is not None):
                self.handles.append(m._register_state_dict_hook(_partitioned_placeholders))
                self.handles.append(m._register_load_state_dict_pre_hook(_refuse_loading_placeholders,
                                                                             with_module=True))

    def _pre_forward(self, module, args):
        if module is self.model and not _ACTIVE:
            self.prefetcher.begin_pass()
        recs = _records(module)
        for r in recs:
            r.refs += 1
        gather(recs)
        if recs:
            self.prefetcher.visit(module)
        _ACTIVE.append(module)

    def _post_forward(self, module, args, output):
        if _ACTIVE and _ACTIVE[-1] is module:
            _ACTIVE.pop()
        recs = _records(module)
        outputs = list(nested_tensors(output))
        if _ACTIVE:
            _keep_returned_parameters(outputs)
        if torch.is_grad_enabled():
            for t in outputs:
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(lambda grad, m=module: self._pre_backward(m))
        for r in recs:
            r.refs -= 1
            r.release(resize=True)
        if module is self.model and not _ACTIVE:
            self.prefetcher.end_pass()

    def _pre_backward(self, module):
        recs = _records(module)
        for r in recs:
            r.backward_hold = True
        gather(recs)
        if recs:
            self.backward_prefetcher.visit(module)

    def begin_backward(self):
        self.backward_prefetcher.begin_pass()

    def end_backward(self):
        """Waits for what the backward prefetched and never used, and frees it."""
        self.backward_prefetcher.end_pass()

    def prefetch_launches(self):
        """(forward, backward) all-gathers launched ahead of use so far."""
        return self.prefetcher.launches, self.backward_prefetcher.launches

    def detach(self):
        for h in self.handles:
            h.remove()
        self.handles = []
        for m in self.model.modules():
            if isinstance(m._parameters, ZeroParamDict):
                m._parameters = dict(m._parameters)
            for name in ("_dsfast_z3_hooked", "_dsfast_leaf_subtree"):
                m.__dict__.pop(name, None)
            for p in m._parameters.values():
                if p is not None and hasattr(p, "ds_z3_leaf_module"):
                    del p.ds_z3_leaf_module


def hooked(module):
    """Whether a ParamCoordinator placed its hooks on `module` (and has not detached)."""
    return bool(module.__dict__.get("_dsfast_z3_hooked"))


def _leaf_subtrees(model):
    """{id(module): the outermost leaf module containing it (itself for a leaf)} for every module inside a leaf;
    each leaf keeps its subtree (what it gathers) and its parameters point at it (DeepSpeed's ds_z3_leaf_module)."""
    inside = {}
    for leaf in model.modules():
        if not getattr(leaf, "_z3_leaf", False) or id(leaf) in inside:
            continue
        subtree = list(leaf.modules())
        leaf.__dict__["_dsfast_leaf_subtree"] = subtree
        for m in subtree:
            inside[id(m)] = leaf
        for p in leaf.parameters():
            p.ds_z3_leaf_module = leaf
    return inside


def _released(module):
    return [n for n, p in dict.items(module._parameters)
            if p is not None and record_of(p) is not None and not record_of(p).gathered]


def _partitioned_placeholders(module, state_dict, prefix, local_metadata):
    """state_dict() of released parameters: DeepSpeed's placeholders (empty tensors), on every rank, marked so
    that a file saved from them refuses to load (placeholders.py)."""
    for name in _released(module):
        key = prefix + name
        if key in state_dict:
            shape = record_of(module._parameters[name]).shape
            state_dict[key] = PartitionedPlaceholder.of(state_dict[key], key, shape)


def _refuse_loading_placeholders(module, state_dict, prefix, *args):
    """load_state_dict of placeholders into a partitioned module would copy nothing (both are empty): refused."""
    refuse_placeholders(state_dict, [prefix + n for n, p in dict.items(module._parameters)
                                     if p is not None and record_of(p) is not None])


