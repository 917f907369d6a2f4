"""The check every dsfast.utils setter (safe_set_*) makes on the value it is given, before any owner writes it."""
import torch


def checked_value(value, numel, api, what):
    """`value` flattened (a view where it can be), or a clear error: a tensor of exactly `numel` elements is
    needed. what: the expected shape in words, for the message (e.g. "parameter of shape (4, 3)")."""
    if not torch.is_tensor(value):
        raise TypeError(f"{api}: value must be a torch.Tensor, got {type(value).__name__}")
    if value.numel() != numel:
        raise ValueError(f"{api}: value has {value.numel()} elements (shape {tuple(value.shape)}) but the "
                         f"{what} has {numel}")
    if value.is_floating_point() is False:
        raise TypeError(f"{api}: value must be a floating-point tensor, got {value.dtype}")
    return value.detach().reshape(-1)
