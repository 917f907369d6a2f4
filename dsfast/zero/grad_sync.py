"""Gradient synchronisation strategies (one per ZeRO stage; stage 0 is plain data parallelism).

A strategy sees every parameter's gradient the moment autograd finishes accumulating it (post-accumulate-grad
hooks), and is told by the engine when a backward starts and ends. Interface used by the engine:
    begin_backward(reduce: bool)   reduce=False between accumulation boundaries (no communication at all)
    end_backward()                 launch what is left, wait for everything; grads are then reduced
    prepare_step(names)            before the optimizer step: adopt gradients the user cleared since backward;
                                   refuse gradients that came from a plain loss.backward() (never reduced)
    reset()                        after the step (the buffers were zeroed)
    post_reduce_factor             what the reduced grads must be multiplied by (1/world for a sum all-reduce);
                                   the engine folds it into its single unscale/clip pass
    detach()                       remove hooks
ZeRO stages 1-2 slot in as a reduce-scatter strategy over the same GradBuffers.
"""
import torch
import torch.distributed as dist


class AllReduceGradSync:
    """Stage 0: bucketed SUM all-reduce, launched in bucket order while backward still runs."""

    def __init__(self, buffers, world_size, group=None):
        self.buffers = buffers
        self.world_size = world_size
        self.group = group
        self.post_reduce_factor = 1.0 / world_size
        self._reduce = False
        self._in_backward = False
        self._next = 0  # index of the next bucket to launch (launch order must be identical on every rank)
        self.collectives_launched = 0  # for tests and diagnostics
        self._reduced_since_step = False
        self._outside = {}  # id(param) -> param: gradients that arrived outside this engine's backward
        self._hooks = []
        for p in buffers.params:
            self._hooks.append(p.register_hook(lambda grad, p=p: self.buffers.before_accumulate(p)))
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))

    def begin_backward(self, reduce):
        self._reduce = reduce and self.world_size > 1
        if self._reduce and self._reduced_since_step:
            # A second reducing backward before the step (a GAN's backward(err_real); backward(err_fake)): the
            # buckets hold the SUM of the first losses' gradients. Make it the mean, so that adding this
            # backward's local gradients and summing again gives sum(first) + sum(second), as one backward of
            # the summed losses would (post_reduce_factor still divides by the world size).
            with torch.no_grad():
                torch._foreach_mul_(self.buffers.flats(), 1.0 / self.world_size)
        self._outside.clear()  # gradients deposited earlier (by another engine's backward) are now ours
        self._in_backward = True
        self._next = 0
        for b in self.buffers.buckets:
            b.ready.clear()
            b.handle = None

    def _on_grad(self, param):
        bucket = self.buffers.absorb(param)
        if not self._in_backward:
            self._outside[id(param)] = param
            return
        if not self._reduce:
            return
        if bucket.handle is not None:
            raise RuntimeError(
                f"a gradient for a parameter of shape {tuple(param.shape)} arrived after its bucket was already "
                "all-reduced in this backward (is the parameter used by a reentrant checkpoint twice?); use "
                "non-reentrant activation checkpointing (torch.utils.checkpoint(..., use_reentrant=False))")
        bucket.ready.add(id(param))
        self._launch_ready()

    def _launch_ready(self):
        buckets = self.buffers.buckets
        while self._next < len(buckets) and len(buckets[self._next].ready) == len(buckets[self._next].params):
            self._launch(buckets[self._next])

    def _launch(self, bucket):
        bucket.handle = dist.all_reduce(bucket.flat, group=self.group, async_op=True)
        self.collectives_launched += 1
        self._next += 1

    def end_backward(self):
        self._in_backward = False
        if not self._reduce:
            return
        # parameters that got no gradient this backward leave their bucket incomplete: launch it anyway
        while self._next < len(self.buffers.buckets):
            self._launch(self.buffers.buckets[self._next])
        for b in self.buffers.buckets:
            b.handle.wait()
            b.handle = None
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


def build_grad_sync(zero_stage, buffers, world_size, group=None, shared_table=None):
    """`shared_table`: the shm_reduce.SharedTable the buffers were allocated from (same-host CPU ranks)."""
    if zero_stage == 0:
        if shared_table is not None and shared_table.table is not None and buffers.storage is not None:
            from .shm_reduce import ShmAllReduceGradSync
            return ShmAllReduceGradSync(buffers, world_size, shared_table.table, group)
        return AllReduceGradSync(buffers, world_size, group)
    raise NotImplementedError(f"ZeRO stage {zero_stage} gradient partitioning is not implemented yet")
