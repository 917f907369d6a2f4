"""The tensors inside a module's inputs or outputs (nested tuples, lists and dicts, Hugging Face ModelOutput)."""
import torch


def nested_tensors(obj):
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from nested_tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from nested_tensors(o)
