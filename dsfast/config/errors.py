"""The one error type for a bad ds_config, and how pydantic's errors become readable lines."""
from __future__ import annotations

import difflib
from typing import Iterable, List, Optional, Sequence, Tuple

# A problem is (path, message); path is a tuple of keys/indices from the config root.
Problem = Tuple[Tuple, str]


class DsConfigError(ValueError):
    """A ds_config that dsfast cannot use. `problems` lists (dotted path, message) pairs."""

    def __init__(self, message: str, problems: Optional[List[Tuple[str, str]]] = None, source: Optional[str] = None):
        super().__init__(message)
        self.problems = problems or []
        self.source = source


def dotted(path: Sequence) -> str:
    """('fp16', 'hysteresis') -> 'fp16.hysteresis'; list indices as [i]."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def suggest(word: str, candidates: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the nearest candidate, or a list of valid keys when nothing is close."""
    candidates = sorted(set(candidates))
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    if not close:
        # A typo in the middle of a long key (loss_scale_windw) still shares a long prefix.
        close = [c for c in candidates if c.lower().startswith(word.lower()[:6])][:1] if len(word) >= 6 else []
    if close:
        return f"did you mean {close[0]!r}?"
    if len(candidates) <= 25:
        return "valid keys here: " + ", ".join(candidates)
    return ""


def format_problems(problems: List[Tuple[str, str]], source: Optional[str]) -> str:
    where = f" ({source})" if source else ""
    n = len(problems)
    head = f"invalid ds_config{where}: {n} problem{'s' if n != 1 else ''}"
    return head + "\n" + "\n".join(f"  - {path or '<top level>'}: {msg}" for path, msg in problems)


def raise_problems(problems: List[Tuple[str, str]], source: Optional[str] = None):
    raise DsConfigError(format_problems(problems, source), problems, source)
