"""What FusedAdam and FusedSGD share: gathering a param group into kernel lists, the amp scalars,
and the step() preamble (closure, GradScaler's grad_scale/found_inf attributes)."""
import torch

from ..ops import multi_tensor

_HALF = (torch.float16, torch.bfloat16)
_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def amp_scalars(device, grad_scale, found_inf, clip_coef, cache):
    """(inv_scale, found_inf, clip_coef) on `device`, computed once per device per step."""
    if device not in cache:
        inv = None
        if grad_scale is not None:
            if not isinstance(grad_scale, torch.Tensor) or grad_scale.numel() != 1:
                raise TypeError(f"grad_scale must be a one-element tensor (GradScaler's scale), got {grad_scale!r}")
            # Same inverse as GradScaler.unscale_: computed in double, rounded once.
            inv = grad_scale.to(device, non_blocking=True).double().reciprocal().float()
        flag = multi_tensor.scalar_tensor("found_inf", found_inf, device)
        coef = multi_tensor.scalar_tensor("clip_coef", clip_coef, device)
        cache[device] = tuple(None if t is None else t.reshape(()) for t in (inv, flag, coef))
    return cache[device]


def grad_for_kernel(p, g, gi, j):
    """The gradient as the kernel reads it. The fast path is a few attribute reads (this runs
    once per param per step); the message names the param. Shapes need no check: torch
    refuses a .grad of another shape."""
    if g.is_sparse or p.dtype not in _FLOAT or g.dtype not in _FLOAT or not p.is_contiguous():
        where = f"param_groups[{gi}]['params'][{j}]"
        if p.dtype not in _FLOAT:
            raise TypeError(f"{where} has dtype {p.dtype}; FusedAdam/FusedSGD update float32, float16 or "
                            f"bfloat16 params")
        if g.is_sparse:
            raise TypeError(f"{where}.grad is sparse; FusedAdam/FusedSGD need dense gradients")
        if g.dtype not in _FLOAT:
            raise TypeError(f"{where}.grad has dtype {g.dtype}; supported: float32, float16, bfloat16")
        raise ValueError(f"{where} is not contiguous (stride {p.stride()}); the kernel updates params in place")
    return g if g.is_contiguous() else g.contiguous()


def gather(group, gi, states, use_master, init_state, keys, grads=None, outs=None):
    """The group's tensors as kernel lists, bucketed by (device, grad dtype, param dtype,
    master, fresh): {key: (grads, params (the fp32 masters when master), [one list per state
    key], 16-bit model copies or [])}.

    init_state(p, state, master) fills an empty state and returns True when the new state needs
    the kernel's first-step form (SGD's dampened momentum). The common group (one device, one
    dtype pair, dense contiguous tensors) costs one loop of appends plus a few set
    comprehensions, well under torch's own gather; anything else takes a per-param loop whose
    errors name the param.

    grads / outs (the amp contract, optim/amp_step.py): this group's gradients instead of p.grad, and the
    16-bit tensors that receive each updated fp32 param (the kernel's model copies)."""
    gs, ps, sts, fresh, given_outs = [], [], [], set(), []
    for j, p in enumerate(group["params"]):
        g = grads[j] if grads is not None else p.grad
        if g is None:
            continue
        if outs is not None:
            given_outs.append(outs[j])
        st = states[p]
        if (not st or (keys and st.get(keys[0]) is None)) and init_state(p, st, use_master and p.dtype in _HALF):
            fresh.add(id(p))
        gs.append(g)
        ps.append(p)
        sts.append(st)
    if not ps:
        return {}
    gkinds = {(g.dtype, g.layout) for g in gs}
    pdts = {p.dtype for p in ps}
    one_device = len({p.get_device() for p in ps}) == 1
    if len(gkinds) == 1 and len(pdts) == 1 and len(fresh) in (0, len(ps)) and one_device:
        (gdt, layout), = gkinds
        pdt, = pdts
        if layout is torch.strided and gdt in _FLOAT and pdt in _FLOAT and all(g.is_contiguous() for g in gs) \
                and all(p.is_contiguous() for p in ps):
            master = use_master and pdt in _HALF
            targets = [st["master_param"] for st in sts] if master else ps
            copies = ps if master else (given_outs if outs is not None else [])
            return {(ps[0].device, gdt, pdt, master, bool(fresh)):
                    (gs, targets, [[st[k] for st in sts] for k in keys], copies)}
    buckets = {}
    for j, p in enumerate(group["params"]):
        g = grads[j] if grads is not None else p.grad
        if g is None:
            continue
        g = grad_for_kernel(p, g, gi, j)
        st = states[p]
        master = use_master and p.dtype in _HALF
        key = (p.device, g.dtype, p.dtype, master, id(p) in fresh)
        b = buckets.get(key)
        if b is None:
            b = buckets[key] = ([], [], [[] for _ in keys], [])
        b[0].append(g)
        b[1].append(st["master_param"] if master else p)
        for lst, k in zip(b[2], keys):
            lst.append(st[k])
        if master:
            b[3].append(p)
        elif outs is not None:
            b[3].append(outs[j])
    return buckets


class FusedOptimizer(torch.optim.Optimizer):
    """Base of FusedAdam / FusedSGD: master-weight choice and the step() preamble."""

    _step_supports_amp_scaling = True   # torch.amp.GradScaler passes grad_scale/found_inf to step()
    _dsfast_amp_step = True             # and grads= / out16= (the engine's contract, optim/amp_step.py)
    _dsfast_element_wise = True         # each parameter's update reads only its own state (optim/element_wise.py)

    def _set_master_weights(self, master_weights):
        if not isinstance(master_weights, bool):
            raise TypeError(f"master_weights must be a bool, got {master_weights!r}")
        self.master_weights = master_weights

    def _uses_master(self, p):
        return self.master_weights and p.dtype in _HALF

    def prepare_amp_step(self, *, grad_scale=None, found_inf=None, clip_coef=None):
        """The per-unit entry (optim/amp_step.py prepare_step): every group's hyperparameters validated once (and
        the amp scalars copied to each device once), then step(parts) runs the kernels over the parameters parts
        names, as step(grads=, out16=) would over all of them."""
        _, grad_scale, found_inf = self._begin_step(None, grad_scale, found_inf)
        checked = [self._group_hyperparameters(group) for group in self.param_groups]
        amp, scalars = (grad_scale, found_inf, clip_coef), {}

        def step(parts):
            with torch.no_grad():
                for gi, (group, hparams, (indices, grads, outs)) in enumerate(zip(self.param_groups, checked, parts)):
                    if len(indices):
                        members = {"params": [group["params"][j] for j in indices]}
                        self._step_group(gi, group, hparams, members, grads, outs, amp, scalars)
        return step

    def _begin_step(self, closure, grad_scale, found_inf):
        """(loss, grad_scale, found_inf): runs the closure; GradScaler may also set the scalars as attributes."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grad_scale is None:
            grad_scale = getattr(self, "grad_scale", None)
        if found_inf is None:
            found_inf = getattr(self, "found_inf", None)
        return loss, grad_scale, found_inf
