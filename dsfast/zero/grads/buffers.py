"""Flat gradient buckets: every trainable parameter's gradient lives in a slice of one flat tensor per bucket.

Flat storage lets the all-reduce, the norm and the unscale/clip pass touch a few large tensors instead of many
small ones. Buckets are filled in reverse parameter order (roughly the order backward produces gradients), so
the first bucket is complete early in backward and its all-reduce overlaps the rest.

Two modes:
- `grads_are_views=True` (fp32 training): `param.grad` *is* the slice, so autograd accumulates straight into the
  bucket and nothing is copied.
- `grads_are_views=False` (fp16/bf16 training): buckets are fp32; each half-precision gradient is added into
  its fp32 slice as soon as it is produced (fp32 accumulation across micro-steps). `param.grad` keeps the
  16-bit gradient just absorbed (a receipt, as DeepSpeed's fp16 stage 0 keeps 16-bit grads) until the step.

The buckets mirror `param.grad` as torch would have it: a user who clears or replaces gradients between
backwards (`module.zero_grad()`, a client `optimizer.zero_grad()`, `p.grad = None`, an in-place `zero_`) clears
or replaces the slice too. `reconcile(param)` runs before each new gradient is accumulated (a tensor pre-hook)
and for every parameter before the optimizer step; a GAN's generator backward that deposits gradients into
the discriminator, cleared by `netD.zero_grad()`, therefore never leaks into the discriminator's next step.
"""
from dataclasses import dataclass, field
from typing import List

import torch

from ..policy.partition import plan_buckets


@dataclass
class Bucket:
    index: int
    flat: torch.Tensor
    params: List[torch.nn.Parameter]
    views: List[torch.Tensor]
    offset: int = 0            # start of `flat` in the shared storage (when one storage holds every bucket)
    handle: object = None      # pending async collective
    ready: set = field(default_factory=set)  # ids of params whose grad arrived in this backward


class GradBuffers:
    def __init__(self, params, layout, grads_are_views, accum_dtype=torch.float32, allocate=None):
        """`layout`: the bucket plan, a list of (params, padded_numel) per bucket (partition.plan_buckets' order;
        the padding lets each bucket split evenly across ranks). `allocate(numel, dtype, device)`, when given,
        provides one zeroed 1-D storage for all buckets (used for shared-memory reduction); it is only asked when
        every bucket has the same dtype and device."""
        self.params = list(params)
        self.grads_are_views = grads_are_views
        self.buckets: List[Bucket] = []
        self.bucket_of = {}  # id(param) -> (bucket, position)
        self.offset_of = {}  # id(param) -> where its slice starts in its bucket
        self.storage = None
        self.masters = {}    # id(param) -> fp32 master whose .grad is the param's slice (half precision)
        self._receipts = {}  # id(param) -> (16-bit grad last absorbed, its version counter), half precision
        if not self.params:   # nothing trained (an engine used for inference only)
            return
        dtype_of = (lambda p: p.dtype) if grads_are_views else (lambda p: accum_dtype)
        total = sum(padded for _, padded in layout)
        if allocate is not None and len({(dtype_of(p), p.device) for p in self.params}) == 1:
            self.storage = allocate(total, dtype_of(self.params[0]), self.params[0].device)
        offset = 0
        for ps, padded in layout:
            flat = self.storage[offset:offset + padded] if self.storage is not None else \
                torch.zeros(padded, dtype=dtype_of(ps[0]), device=ps[0].device)
            self._add_bucket(ps, flat, offset)
            offset += padded

    def _add_bucket(self, params, flat, storage_offset):
        views, offset = [], 0
        for p in params:
            views.append(flat[offset:offset + p.numel()].view(p.shape))
            self.offset_of[id(p)] = offset   # within its bucket
            offset += p.numel()
        bucket = Bucket(len(self.buckets), flat, params, views, storage_offset)
        for pos, p in enumerate(params):
            self.bucket_of[id(p)] = (bucket, pos)
            if self.grads_are_views:
                if p.grad is not None:
                    views[pos].copy_(p.grad)
                p.grad = views[pos]
        self.buckets.append(bucket)

    def view_of(self, param):
        bucket, pos = self.bucket_of[id(param)]
        return bucket.views[pos]

    def attach_master(self, param, master):
        """fp16/bf16: `master.grad` is the param's fp32 slice (what the optimizer reads)."""
        self.masters[id(param)] = master
        master.grad = self.view_of(param)

    def reconcile(self, param):
        """Make the slice equal what torch says the param's gradient is now. Returns True when the user had
        cleared it (the slice is zero), False otherwise. Cheap: identity and version-counter checks only."""
        bucket, pos = self.bucket_of[id(param)]
        view = bucket.views[pos]
        master = self.masters.get(id(param))
        if master is not None and master.grad is not view:   # a client optimizer's zero_grad on the masters
            cleared = master.grad is None
            view.copy_(master.grad) if not cleared else view.zero_()
            master.grad = view
            self._receipts.pop(id(param), None)
            return cleared
        grad = param.grad
        if self.grads_are_views:
            if grad is view:
                return False
            view.copy_(grad) if grad is not None else view.zero_()  # replaced or cleared (set_to_none)
            param.grad = view
            return grad is None
        receipt = self._receipts.get(id(param))
        if receipt is None:          # nothing absorbed since the last zero: the slice is zero already
            if grad is not None:     # a gradient the user assigned
                view.copy_(grad)
            return False
        tensor, version = receipt
        if grad is tensor and grad._version == version:
            return False
        del self._receipts[id(param)]
        if grad is None:
            view.zero_()
            return True
        view.copy_(grad)             # replaced or modified in place (zero_grad(set_to_none=False) zeroes it)
        if grad is tensor:
            self._receipts[id(param)] = (grad, grad._version)
        return not bool(grad.any()) if grad is tensor else False

    def before_accumulate(self, param):
        """Tensor pre-hook: reconcile, then let autograd accumulate into the slice (fp32) or hand over a fresh
        16-bit gradient (half precision: the receipt is dropped so autograd does not add onto it)."""
        self.reconcile(param)
        if not self.grads_are_views:
            param.grad = None

    def absorb(self, param):
        """Move a freshly accumulated `param.grad` into its slice (no-op when it already is the slice)."""
        bucket, pos = self.bucket_of[id(param)]
        view = bucket.views[pos]
        grad = param.grad
        if grad is None or grad is view:
            return bucket
        if self.grads_are_views:
            # autograd replaced the slice it accumulated into (create_graph=True does): its value is the total
            if grad.data_ptr() != view.data_ptr():
                view.copy_(grad)
            param.grad = view
            return bucket
        view.add_(grad)  # view is zero unless accumulating across micro-steps
        self._receipts[id(param)] = (grad, grad._version)
        return bucket

    def keep_late(self, param, grad):
        """A gradient taken elsewhere (its bucket was reduced already: reducer.py sums it on its own) leaves
        `param.grad` as torch's rules would: the slice (fp32), or the 16-bit gradient just produced."""
        if self.grads_are_views:
            param.grad = self.view_of(param)
        else:
            self._receipts[id(param)] = (grad, grad._version)

    def version(self):
        """Changes whenever any bucket is written in place (torch's version counter, shared by the slices): a
        copy made of the buckets is still current while it stays the same."""
        return sum(b.flat._version for b in self.buckets)

    def flats(self):
        return [b.flat for b in self.buckets]

    def zero(self):
        for b in self.buckets:
            b.flat.zero_()
        if self.grads_are_views:  # re-attach slices a user may have dropped (optimizer.zero_grad(set_to_none))
            for b in self.buckets:
                for p, v in zip(b.params, b.views):
                    if p.grad is not v:
                        p.grad = v
        else:
            for p in self.params:
                p.grad = None
            self._receipts.clear()
        for p in self.params:
            master = self.masters.get(id(p))
            if master is not None:
                master.grad = self.view_of(p)

    def numel(self):
        return sum(b.flat.numel() for b in self.buckets)


def replicated_layout(params, bucket_elems, grads_are_views, accum_dtype=torch.float32):
    """Stage 0's buckets: partition.plan_buckets over one rank (nothing to pad), a bucket never mixing dtypes or
    devices, cut at `bucket_elems` in reverse parameter order."""
    kinds = [(p.dtype if grads_are_views else accum_dtype, str(p.device)) for p in params]
    plans = plan_buckets([p.numel() for p in params], [0] * len(params), kinds, max(1, int(bucket_elems)), 1, 1)
    return [([params[e.param] for e in plan.entries], plan.numel) for plan in plans]
