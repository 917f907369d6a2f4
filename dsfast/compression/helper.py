"""deepspeed.compression.helper's module-path helpers, which DeepSpeed-Chat imports to swap layers (LoRA)."""


def recursive_getattr(model, module_name):
    """The attribute at the dotted path `module_name` under `model` ("decoder.layers.0.fc1")."""
    out = model
    walked = []
    for part in module_name.split("."):
        if not hasattr(out, part):
            where = ".".join(walked) or type(model).__name__
            raise AttributeError(f"recursive_getattr: {module_name!r}: {where!r} has no attribute {part!r}")
        out = getattr(out, part)
        walked.append(part)
    return out


def recursive_setattr(model, module_name, module):
    """Set the attribute at the dotted path `module_name` under `model` to `module`; its parent must exist."""
    parent, _, last = module_name.rpartition(".")
    setattr(recursive_getattr(model, parent) if parent else model, last, module)


__all__ = ["recursive_getattr", "recursive_setattr"]
