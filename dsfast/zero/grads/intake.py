"""The one gradient intake of every ZeRO stage: a hook sees each parameter's gradient the moment autograd finished
accumulating it (post-accumulate-grad hooks), puts it in its bucket (or, after the bucket's reduction in this
backward, in the reducer's late buffer) and tells the reducer (reducer.py), which reduces each complete bucket.

The owner tells when a backward starts and ends and when the step comes:
    begin_backward(reduce)   reduce: this backward ends an accumulation window (the boundary)
    end_backward()           reduce what is left, wait for everything
    prepare_step(names)      before the optimizer step: refuse gradients no engine.backward() produced
    reset()                  after the step (the gradients were zeroed)
    detach()                 hooks off

Two kinds of buckets (grad_buckets.py), one intake:
  resident (stages 0-1, `buffers`: a grad_buffers.GradBuffers)  the gradient stays where torch keeps it, a slice of
      the bucket that is `param.grad`; the bucket is reduced in place at the boundary only (nothing is sent
      between boundaries, nor on one rank). Gradients from outside this engine's backward are torch's business
      until the step, which adopts what the user cleared and refuses the rest.
  staged (stages 2-3)  every backward's gradient is taken from `param.grad` (left None) into its bucket's staging
      buffer; its reduce-scatter is added into this rank's accumulating gradient shard. A `param.grad` left at
      the step came from a plain loss.backward() and is refused.
`landed(bucket)` runs when a bucket holds the window's reduced sum (the offload copy to the host, overlapping the
rest of backward); `taken(i)` after param i's gradient was taken (stage 3 releases the gathered parameter).
"""
import torch


class GradIntake:
    def __init__(self, params, reducer, world, buffers=None, chunks=None, entries=None, landed=None, taken=None,
                 stage=None):
        """params: the trained parameters; the reducer's param indices are positions in this list.
        buffers, chunks: resident buckets (stage 1's (lo, hi) of each bucket that this rank owns; None at stage 0).
        entries: staged buckets: what reducer.add needs to place param i's gradient (its Entry or record)."""
        self.params = list(params)
        self.reducer = reducer
        self.world_size = world
        self.buffers = buffers
        self.chunks = chunks
        self.entries = entries
        self.stage = stage
        self.resident = buffers is not None
        self.post_reduce_factor = 1.0 / world
        self._index = {id(p): i for i, p in enumerate(self.params)}
        self._landed = landed
        self._taken = taken
        self._reduce = False        # gradients of this backward go to the reducer
        self._boundary = True       # ... and end an accumulation window (the host copies are made then)
        self._in_backward = False
        self._reduced_since_step = False
        self._outside = {}  # resident: id(param) -> param, gradients that arrived outside this engine's backward
        reducer.on_reduced = self._reduced if landed is not None else None
        self._hooks = []
        for p in self.params:
            if self.resident:   # (before autograd accumulates: see _before_grad)
                self._hooks.append(p.register_hook(lambda grad, p=p: self._before_grad(p)))
            self._hooks.append(p.register_post_accumulate_grad_hook(
                self._on_resident_grad if self.resident else self._on_staged_grad))

    # ---- a backward --------------------------------------------------------------------------------------
    @torch.no_grad()
    def begin_backward(self, reduce):
        self._boundary = reduce
        # staged buckets are reduced in every backward (the shards accumulate); resident ones at the boundary,
        # and not at all on one rank (its gradients are the sum already)
        self._reduce = not self.resident or (reduce and self.world_size > 1)
        if self.resident:
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

    @torch.no_grad()
    def end_backward(self):
        """Returns whether this backward ended an accumulation window with every bucket reduced (and copied to the
        host where `landed` asks)."""
        self._in_backward = False
        if not self._reduce:
            return False
        # buckets some of whose parameters got no gradient this backward are reduced anyway (every rank runs the
        # same collectives, whatever reached it), then everything in flight and the late buffers
        self.reducer.end()
        if self.resident:
            self._reduce = False
            self._reduced_since_step = True
        return self._boundary

    def _reduced(self, bucket):
        if self._boundary:
            self._landed(bucket)

    # ---- the hooks ---------------------------------------------------------------------------------------
    def _late(self, param):
        """Param's bucket was reduced in this backward already: a second gradient of it (a parameter used inside a
        reentrant activation checkpoint and outside it) must not be added onto the bucket's sum."""
        return self._reduce and self._in_backward and self.reducer.reduced(self._index[id(param)])

    def _before_grad(self, param):
        self.buffers.before_accumulate(param)
        if self._late(param):
            param.grad = None   # autograd hands the gradient over on its own instead of adding it into the slice

    @torch.no_grad()
    def _on_resident_grad(self, param):
        if self._late(param):
            grad = param.grad
            self.reducer.add(self._index[id(param)], None, grad.reshape(-1))   # reduced on its own by end()
            self.buffers.keep_late(param, grad)
            return
        self.buffers.absorb(param)
        if not self._in_backward:
            self._outside[id(param)] = param
            return
        if self._reduce:
            self.reducer.add(self._index[id(param)], None, None)   # (in its bucket already)

    @torch.no_grad()
    def _on_staged_grad(self, param):
        # Outside engine.backward (another engine's backward through this model) param.grad is left to torch's
        # rules: the user's zero_grad() clears it; one not cleared joins this engine's next backward (autograd
        # adds onto it) or is refused at the step.
        grad = param.grad
        if grad is None or not self._in_backward:
            return
        i = self._index[id(param)]
        self.reducer.add(i, self.entries[i], grad.reshape(-1))
        param.grad = None
        if self._taken is not None:
            self._taken(i)

    # ---- the step ----------------------------------------------------------------------------------------
    def prepare_step(self, name_of):
        """Refuse gradients no engine.backward() produced (resident: after adopting what the user did to .grad
        since backward). name_of: id(param) -> its name in the module (for the error)."""
        if not self.resident:
            stray = [p for p in self.params if p.grad is not None]
            if stray:
                picked = [name_of.get(id(p), "?") for p in stray][:3]
                raise RuntimeError(
                    f"engine.step(): {len(stray)} parameter(s) ({', '.join(picked)}) got gradients from a "
                    "backward that was not this engine's backward (a plain loss.backward()) after its last "
                    f"engine.backward(); under ZeRO stage {self.stage} they were never reduce-scattered into the "
                    "partitions. Call engine.backward(loss) instead of loss.backward()")
            return
        for p in self.params:
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
