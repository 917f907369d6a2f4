"""What an optimizer declares about its update, so that ZeRO may step it one shard unit at a time (the NVMe walk)
and budget its states before the first step:

    _dsfast_element_wise = True       its update of a parameter reads only that parameter's gradient and state,
                                      and its step counts live per parameter: stepping units one by one is exact
    _dsfast_states_per_element = n    the optimizer states per parameter element its first step creates (0: unknown)

dsfast's optimizers declare both (optim/_cpu_op.py, optim/_fused_common.py and the classes). torch's built-in
element-wise optimizers cannot carry an attribute of ours, so they are declared here, by class, once. Any other
optimizer (a client's) declares nothing: it is not stepped unit by unit, and its states are not budgeted.
"""
import torch

# torch's element-wise optimizers -> their states per element (None: not budgeted, as before the declaration)
_TORCH_STATES = {
    torch.optim.Adam: 2, torch.optim.AdamW: 2, torch.optim.NAdam: 2, torch.optim.RAdam: 2, torch.optim.Adamax: 2,
    torch.optim.Adagrad: 1, torch.optim.SGD: "momentum", torch.optim.RMSprop: None,
}


def _torch_entry(optimizer):
    for cls, states in _TORCH_STATES.items():
        if isinstance(optimizer, cls):
            return True, states
    return False, None


def is_element_wise(optimizer):
    """Whether `optimizer` may be stepped one unit of parameters at a time with the result of one whole step."""
    declared = getattr(optimizer, "_dsfast_element_wise", None)
    if declared is not None:
        return bool(declared)
    return _torch_entry(optimizer)[0]


def states_per_element(optimizer):
    """Optimizer states the first step creates per parameter element (Adam's two moments, SGD's momentum, Adagrad's
    sum, Lion's momentum), or 0 where the optimizer does not say."""
    declared = getattr(optimizer, "_dsfast_states_per_element", None)
    if declared is None:
        declared = _torch_entry(optimizer)[1]
    if declared == "momentum":   # SGD: one buffer where any group has momentum
        return int(any(g.get("momentum", 0) for g in optimizer.param_groups))
    return int(declared or 0)


def element_wise_names():
    """The names of the optimizers known to be element-wise (for an error message): dsfast's that declare it and
    torch's listed here."""
    import dsfast.optim as optim
    ours = {name for name in optim.__all__
            if isinstance(getattr(optim, name), type) and getattr(getattr(optim, name), "_dsfast_element_wise", False)}
    return sorted(ours | {cls.__name__ for cls in _TORCH_STATES})
