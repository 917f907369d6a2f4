"""A plain `loss.backward()` (or `out.backward(grad)`) between engine(...) and engine.step(), as DeepSpeed 0.19.8 has
it (#7665): the engine's forward puts a hook on each output tensor; when a backward that is not an engine.backward
reaches one, the first such hook starts the owner's backward (the accumulation boundary decides whether it reduces)
and queues its end for when autograd finishes, and every output's gradient is divided by the gradient accumulation
steps, as engine.backward divides the loss.

Where 0.19.8 has it: ZeRO stages 1-3, and stage 0 in bf16 (its BF16_Optimizer). fp16 needs the loss scale, which a
plain backward cannot apply: `engine.scale(loss).backward()` applies it (0.19.8's API); without it the backward is
refused before a gradient is deposited (0.19.8 refuses after it; dsfast also refuses fp16 with a static loss scale,
which 0.19.8 lets through unscaled). At stage 0 in fp32 or fp16, where 0.19.8 raises in any backward through the
engine's outputs, dsfast leaves such gradients to the owner, which refuses them at step() unless the program
cleared them (a GAN's generator loss through a discriminator engine is such a backward).
"""
import torch

from ..utils.nested import nested_tensors

_ENGINE_BACKWARDS = [0]   # engine.backward() calls in progress, in any engine: their graphs are theirs


class engine_backward_running:
    """Marks an engine.backward(): output hooks of every engine leave its gradients alone (a GAN's generator
    backward runs through the discriminator engine's outputs)."""

    def __enter__(self):
        _ENGINE_BACKWARDS[0] += 1

    def __exit__(self, *exc):
        _ENGINE_BACKWARDS[0] -= 1


class PlainBackward:
    def __init__(self, engine):
        self.engine = engine
        self.active = False            # a plain backward of this engine is running
        self.scaled = False            # engine.scale(loss) was called for the next plain backward

    def supported(self):
        e = self.engine
        return e.optimizer is not None and (e.zero_optimization_stage() > 0 or e.bfloat16_enabled())

    def watch(self, outputs):
        """Hook every floating-point output that requires a gradient (tensors inside tuples, lists, dicts)."""
        if not torch.is_grad_enabled() or self.engine.optimizer is None:
            return
        for t in nested_tensors(outputs):
            if t.requires_grad and t.is_floating_point():
                t.register_hook(self._on_output_grad)

    def _on_output_grad(self, grad):
        if _ENGINE_BACKWARDS[0] or not self.supported():
            return grad
        if not self.active:
            self._prologue()
        gas = self.engine.gradient_accumulation_steps()
        return grad / gas if gas != 1 else grad

    def _prologue(self):
        e = self.engine
        if e._scales_loss and not self.scaled:
            raise RuntimeError(
                "loss scaling is required for this configuration (fp16), but backward() was called without scaling "
                "the loss: use engine.backward(loss), or engine.scale(loss).backward()")
        e.require_states("backward")
        self.active = True
        e._owner.settle(agree=True)   # overlap_step: the last step done (engine.backward's, for a plain one)
        e._owner.begin_backward(e._backward_reduces())
        torch.autograd.Variable._execution_engine.queue_callback(self._epilogue)

    def _epilogue(self):
        self.active = self.scaled = False
        self.engine._owner.end_backward()
