"""data_types.keep_in_fp32_modules: the buffers a model names for fp32 stay fp32 while it trains in fp16/bf16.

Hugging Face models name them in two class attributes: `_keep_in_fp32_modules_strict` (fp32 under bf16 and fp16)
and `_keep_in_fp32_modules` (fp32 under fp16 only). MoE routers' score-correction biases are the case that matters:
256 experts' biases a few hundredths apart collapse to a handful of bf16 values and tokens go to other experts.

As DeepSpeed 0.19.8 defines it: "auto" (default) takes the model's own lists, a list of name patterns replaces
them (`*` any characters, matched anywhere in the buffer's full name; a model's own names are matched under the
module that lists them), [] keeps nothing. Only floating buffers are kept; parameters follow the training dtype.
Applied where the model is cast (initialize: its original fp32 values are put back after the cast) and at the end
of each module's construction under zero.Init (a buffer made in 16 bits is turned to fp32 before a checkpoint
is loaded into it).
"""
import re

import torch

AUTO = "auto"


def fp32_pattern(module, setting, dtype):
    """A compiled regex over full buffer names, or None when nothing is kept (fp32 training included)."""
    if dtype not in (torch.float16, torch.bfloat16):
        return None
    if setting is None or setting == AUTO:
        patterns = set()
        for prefix, child in module.named_modules():
            names = set(getattr(child, "_keep_in_fp32_modules_strict", None) or ())
            if dtype == torch.float16:
                names |= set(getattr(child, "_keep_in_fp32_modules", None) or ())
            for name in names:
                body = name.replace("*", ".*")
                patterns.add(rf"^{re.escape(prefix)}\..*{body}" if prefix else body)
    else:
        patterns = {name.replace("*", ".*") for name in setting}
    return re.compile("|".join(sorted(patterns))) if patterns else None


def kept_buffers(module, pattern):
    """[(owning module, buffer name, tensor)] of the floating buffers whose full names match `pattern`."""
    out = []
    for prefix, owner in module.named_modules():
        for name, buf in owner.named_buffers(recurse=False):
            full = f"{prefix}.{name}" if prefix else name
            if buf is not None and buf.is_floating_point() and pattern.search(full):
                out.append((owner, name, buf))
    return out


def upcast_kept(module, setting, dtype):
    """Turn the matching buffers of `module` to fp32 in place (zero.Init). Returns how many changed."""
    pattern = fp32_pattern(module, setting, dtype)
    changed = 0
    for owner, name, buf in kept_buffers(module, pattern) if pattern is not None else ():
        if buf.dtype != torch.float32:
            owner._buffers[name] = buf.float()
            changed += 1
    return changed


class KeptFp32:
    """The matching buffers' values before the model is cast; restore() puts them back (as fp32) after it."""

    def __init__(self, module, setting, dtype):
        pattern = fp32_pattern(module, setting, dtype)
        kept = kept_buffers(module, pattern) if pattern is not None else []
        self.saved = [(owner, name, buf.detach().float()) for owner, name, buf in kept]

    @torch.no_grad()
    def restore(self):
        for owner, name, value in self.saved:
            current = owner._buffers.get(name)
            owner._buffers[name] = value.to(current.device if current is not None else value.device)
        return len(self.saved)
