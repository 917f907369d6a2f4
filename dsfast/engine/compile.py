"""engine.compile(): torch.compile of the module, as DeepSpeed 0.19.8's engine.compile() does without DeepCompile.

    engine.compile(backend="inductor", compile_kwargs={"mode": "max-autotune"})
    engine.is_compiled     # True afterwards

accelerate calls it whenever a dynamo backend is set. The module's own forward is compiled in place
(nn.Module.compile), so engine(...), its hooks (stage 3's gathers, the flops profiler) and state_dict() names stay
as they were. DeepCompile's schedule= and compiled autograd are refused by name; a second call is a no-op.
"""
import logging

logger = logging.getLogger("dsfast")


class Compiling:
    _is_compiled = False

    @property
    def is_compiled(self):
        return self._is_compiled

    def compile(self, backend=None, compile_kwargs=None, schedule=None, compiled_autograd_enabled=False):
        """Compile the module with torch.compile (backend: the accelerator's default, "inductor")."""
        from dsfast.accelerator import get_accelerator
        if schedule is not None:
            raise ValueError("engine.compile(schedule=...) is a DeepCompile schedule; dsfast has no DeepCompile "
                             "(its ZeRO passes): leave schedule=None")
        if compiled_autograd_enabled:
            raise NotImplementedError("engine.compile(compiled_autograd_enabled=True) is not supported by dsfast: "
                                      "its backward reduces gradients from autograd hooks; leave it False")
        if self._is_compiled:
            return
        compile_kwargs = dict(compile_kwargs or {})
        if "backend" in compile_kwargs:
            logger.warning("engine.compile: the backend in compile_kwargs is overridden by the backend argument")
        backend = backend if backend is not None else get_accelerator().get_compile_backend()
        self.module.compile(**{**compile_kwargs, "backend": backend})
        self._is_compiled = True
