"""Checkpoint tags: whatever the user passes (a str, an int, a float like loss.item()) -> a safe folder name."""
import math

from .errors import CheckpointError

MAX_TAG_BYTES = 200          # leaves room under the usual 255-byte name limit for our temporary prefixes
_FORBIDDEN = set('/\\<>:"|?*')
RESERVED = {"latest", "latest_universal"}


def default_tag(global_steps):
    return f"global_step{int(global_steps)}"


def normalize_tag(tag, global_steps=0):
    """The folder name for `tag` (None -> global_step{N}); a clear error for a tag that is not a safe name."""
    if tag is None:
        return default_tag(global_steps)
    if isinstance(tag, bool) or not isinstance(tag, (str, int, float)):
        raise CheckpointError(f"checkpoint tag must be a str, int or float, got {type(tag).__name__} {tag!r}")
    if isinstance(tag, float) and not math.isfinite(tag):
        raise CheckpointError(f"checkpoint tag {tag!r} is not finite; pass a finite number or a string")
    text = str(tag)
    problem = _problem(text)
    if problem:
        raise CheckpointError(f"checkpoint tag {text!r} is not a safe folder name: {problem}. Valid tags are "
                              f"1-{MAX_TAG_BYTES} bytes of printable characters without / \\ < > : \" | ? *, "
                              "not starting with '.', e.g. 'global_step100' or 2.3141")
    return text


def _problem(text):
    if not text:
        return "it is empty"
    if len(text.encode("utf-8")) > MAX_TAG_BYTES:
        return f"it is {len(text.encode('utf-8'))} bytes long (at most {MAX_TAG_BYTES})"
    if ".." in text:
        return "it contains '..'"
    if text.startswith("."):
        return "it starts with '.' (reserved for dsfast's temporary folders)"
    bad = sorted(set(text) & _FORBIDDEN)
    if bad:
        return f"it contains {' '.join(repr(c) for c in bad)}"
    if any(not c.isprintable() for c in text):
        return "it contains a control character"
    if text != text.strip():
        return "it starts or ends with whitespace"
    if text in RESERVED:
        return f"{text!r} is the name of the file that points at the newest checkpoint"
    return None
