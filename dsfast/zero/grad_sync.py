"""The gradients of ZeRO stages 0 and 1: torch's `param.grad` semantics over flat buckets (grad_buffers.py), each
bucket handed to the one reduction (reducer.py) as soon as its last gradient arrived in a reducing backward.

A hook sees every parameter's gradient the moment autograd finishes accumulating it (post-accumulate-grad hooks),
and the owner tells when a backward starts and ends:
    begin_backward(reduce: bool)   reduce=False between accumulation boundaries (no communication at all)
    end_backward()                 reduce what is left, wait for everything; the buckets are then reduced
    prepare_step(names)            before the optimizer step: adopt gradients the user cleared since backward;
                                   refuse gradients that came from a plain loss.backward() (never reduced)
    reset()                        after the step (the buffers were zeroed)
    post_reduce_factor             what the reduced grads must be multiplied by (1/world for a SUM reduction);
                                   the step folds it into its single unscale/clip pass
Stage 0 all-reduces each bucket; stage 1 (`chunks`: each bucket's slice of this rank) reduce-scatters it in place.
"""
import torch

from .grad_buckets import ResidentBucket
from .reducer import reducer_for


class BufferedGradSync:
    def __init__(self, buffers, world, rank, group=None, table=None, chunks=None):
        """table: the shm_reduce.SharedTable's table the buffers live in (same-host CPU ranks), or None.
        chunks: stage 1's (lo, hi) of each bucket that this rank owns; None for stage 0."""
        self.buffers = buffers
        self.world_size = world
        self.chunks = chunks
        self.post_reduce_factor = 1.0 / world
        self._index = {id(p): i for i, p in enumerate(buffers.params)}
        buckets = [ResidentBucket(b, [(self._index[id(p)], (buffers.offset_of[id(p)], p.numel())) for p in b.params],
                                  world,
                                  chunks[b.index] if chunks is not None else None) for b in buffers.buckets]
        self.reducer = reducer_for(buckets, world, rank, group, table=table)
        self._reduce = False
        self._in_backward = False
        self._reduced_since_step = False
        self._outside = {}  # id(param) -> param: gradients that arrived outside this engine's backward
        self._hooks = []
        for p in buffers.params:
            self._hooks.append(p.register_hook(lambda grad, p=p: self._before_grad(p)))
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    @torch.no_grad()
    def begin_backward(self, reduce):
        self._reduce = reduce and self.world_size > 1   # one rank: its gradients are the sum already
        if self._reduce and self._reduced_since_step:
            self._again()
        self._outside.clear()  # gradients deposited earlier (by another engine's backward) are now ours
        self._in_backward = True
        if self._reduce:
            self.reducer.begin()

    def _again(self):
        """A second reducing backward before the step (a GAN's backward(err_real); backward(err_fake))."""
        if self.chunks is None:
            # the buckets hold the SUM of the first losses' gradients: make it the mean, so that adding this
            # backward's local gradients and summing again gives sum(first) + sum(second), as one backward of
            # the summed losses would (post_reduce_factor still divides by the world size)
            torch._foreach_mul_(self.buffers.flats(), 1.0 / self.world_size)
            return
        # our slice holds the reduced sum, the rest our local gradients, which were already sent: zero them so
        # that the next reduce-scatter adds only new ones
        for b, (lo, hi) in zip(self.buffers.buckets, self.chunks):
            b.flat[:lo].zero_()
            b.flat[hi:].zero_()

    def _late(self, param):
        """Param's bucket was reduced in this backward already: a second gradient of it (a parameter used inside a
        reentrant activation checkpoint and outside it) must not be added onto the bucket's sum."""
        return self._reduce and self._in_backward and self.reducer.reduced(self._index[id(param)])

    def _before_grad(self, param):
        self.buffers.before_accumulate(param)
        if self._late(param):
            param.grad = None   # autograd hands the gradient over on its own instead of adding it into the slice

    def _on_grad(self, param):
        if self._late(param):
            grad = param.grad
            self.reducer.add(self._index[id(param)], None, grad.reshape(-1))   # reduced on its own by end()
            self.buffers.keep_late(param, grad)
            return
        self.buffers.absorb(param)
        if not self._in_backward:
            self._outside[id(param)] = param
            return
        if not self._reduce:
            return
        self.reducer.add(self._index[id(param)], None, None)

    def end_backward(self):
        self._in_backward = False
        if not self._reduce:
            return
        # parameters that got no gradient this backward leave their bucket incomplete: reduce it anyway
        self.reducer.end()
        self._reduce = False
        self._reduced_since_step = True

    def prepare_step(self, name_of):
        """Adopt what the user did to .grad since backward; refuse gradients no engine.backward() produced.

        name_of: id(param) -> its name in the module (for the error)."""
        for p in self.buffers.params:
            if self.buffers.reconcile(p):
                self._outside.pop(id(p), None)
        if self._outside:
            names = [name_of.get(k, "?") for k in self._outside][:3]
            raise RuntimeError(
                f"engine.step(): {len(self._outside)} parameter(s) ({', '.join(names)}"
                f"{', ...' if len(self._outside) > 3 else ''}) got gradients from a backward that was not this "
                "engine's backward (a plain loss.backward(), or another engine's backward through this model) "
                "after this engine's last engine.backward(); such gradients are neither averaged across ranks nor "
                "scaled for gradient accumulation / fp16. Call engine.backward(loss) instead of loss.backward(), "
                "or clear them (model.zero_grad()) before engine.step()")

    def reset(self):
        self._reduced_since_step = False
        self._outside.clear()

    def detach(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []


def build_grad_sync(buffers, world, rank, group=None, shared=None, chunks=None):
    """The sync of stage 0 (chunks None) or 1 over `buffers`; `shared`: the shm_reduce.SharedTable the buffers were
    allocated from (same-host CPU ranks), if any."""
    table = shared.table if shared is not None and buffers.storage is not None else None
    return BufferedGradSync(buffers, world, rank, group, table=table, chunks=chunks)
