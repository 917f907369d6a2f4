"""Read ds_config text the way DeepSpeed does (it uses hjson): plain JSON, plus // # /* */ comments and trailing
commas, which users' configs often carry, and any other hjson. Errors keep the JSON parser's line and column."""
from __future__ import annotations

import json
from typing import Any, Callable, Optional


def strip_comments_and_trailing_commas(text: str) -> str:
    """Blank out comments and trailing commas outside strings, keeping every line/column position."""
    out = list(text)
    i, n = 0, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if in_string:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_string = False
            i += 1
            continue
        if c == '"':
            in_string = True
        elif c == "#" or text.startswith("//", i):
            while i < n and text[i] != "\n":
                out[i] = " "
                i += 1
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            for k in range(i, end):
                if text[k] != "\n":
                    out[k] = " "
            i = end
            continue
        elif c == ",":
            k = i + 1
            while k < n and (out[k].isspace()):
                k += 1
            if k < n and text[k] in "}]":
                out[i] = " "
        i += 1
    return "".join(out)


def loads(text: str, object_pairs_hook: Optional[Callable] = None) -> Any:
    """json.loads, retried with comments and trailing commas removed, then as hjson (DeepSpeed reads every config
    file with hjson: `hjson.dump` output, quoteless keys and strings, no commas). When all fail, the JSON error is
    raised (it points at the real problem): the first one, or the relaxed retry's when that got further."""
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as first:
        error = first
        relaxed = strip_comments_and_trailing_commas(text)
        if relaxed != text:
            try:
                return json.loads(relaxed, object_pairs_hook=object_pairs_hook)
            except json.JSONDecodeError as second:
                if (second.lineno, second.colno) > (first.lineno, first.colno):
                    error = second
        import hjson      # only for files that are not JSON: most configs never load it
        try:
            return hjson.loads(text, object_pairs_hook=object_pairs_hook or dict)
        except hjson.HjsonDecodeError:
            raise error from None
