"""zero_optimization.ignore_unused_parameters: false. DeepSpeed 0.19.8 checks it where its ZeRO stage 1-2
optimizer offloads to the host (the gradient norm there is summed per parameter, and a trainable parameter with no
gradient fails an assertion naming the option); dsfast checks in the same runs, at the step, before anything is
applied. Elsewhere DeepSpeed never looks at the option, and dsfast notes it as ignored (DsConfig.ignored_settings)."""
import torch


class UnusedParametersError(RuntimeError, AssertionError):
    """Trainable parameters got no gradient in an accumulation window (an AssertionError too, as DeepSpeed's)."""


def checked(config) -> bool:
    z = config.zero_optimization
    return not z.ignore_unused_parameters and z.stage in (1, 2) and z.offload_optimizer_device != "none"


class UnusedParameterCheck:
    def __init__(self, module: torch.nn.Module):
        self._names = {id(p): n for n, p in module.named_parameters() if p.requires_grad}
        self._seen = set()
        self._hooks = [p.register_post_accumulate_grad_hook(self._saw) for p in module.parameters()
                       if p.requires_grad]

    def _saw(self, param):
        self._seen.add(id(param))

    def check(self):
        """At the accumulation boundary: raise if a trainable parameter got no gradient since the last one."""
        missing = [n for i, n in self._names.items() if i not in self._seen]
        self._seen.clear()
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise UnusedParametersError(
                f"zero_optimization.ignore_unused_parameters is false and {len(missing)} trainable parameter(s) "
                f"got no gradient in this step's backward passes: {shown}. Set ignore_unused_parameters to true "
                "(the default) to train them as unused, or make every trainable parameter take part in the loss "
                "(or set requires_grad=False on the ones that do not)")

    def detach(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []


def unused_parameter_check(config, module):
    """The check for this engine, or None where DeepSpeed does not check."""
    return UnusedParameterCheck(module) if checked(config) else None
