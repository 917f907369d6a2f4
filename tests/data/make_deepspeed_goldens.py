"""Record DeepSpeed's traces of the cross-check cases into tests/data/deepspeed_*.json.

    DS_ACCELERATOR=cpu python tests/data/make_deepspeed_goldens.py [KIND ...]   # in an env where deepspeed imports

KIND: one of tests/_deepspeed_cases.KINDS (default: all of them).

The inputs live in tests/_deepspeed_cases.py; the tests compare dsfast against these files always, and against a
live DeepSpeed too when one is importable. Refuses any DeepSpeed but the version the tests expect.
"""
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))    # tests/, for _deepspeed_cases
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import _deepspeed_cases as cases  # noqa: E402


def readable_json(value, indent=""):
    """JSON with one line per innermost record (a step, a field), so a diff shows what changed."""
    def depth(v):
        children = list(v.values() if isinstance(v, dict) else v) if isinstance(v, (dict, list)) else None
        return 0 if children is None else 1 + max((depth(c) for c in children), default=0)
    # a record is a field {alias, default}, a step {lr, beta1} or a whole loss-scale trace [[scale, hysteresis]...]
    record = depth(value) <= 1 or (depth(value) == 2 and not (isinstance(value, dict) and
                                                               any(isinstance(v, dict) for v in value.values())))
    if record:
        return json.dumps(value, sort_keys=True)
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {readable_json(v, inner)}" for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + readable_json(v, inner) for v in value) + "\n" + indent + "]"


def main():
    import deepspeed
    if deepspeed.__version__ != cases.GOLDEN_DEEPSPEED:
        sys.exit(f"DeepSpeed {deepspeed.__version__} is importable; the goldens are of {cases.GOLDEN_DEEPSPEED} "
                 "(change GOLDEN_DEEPSPEED in tests/_deepspeed_cases.py to record another version)")
    kinds = sys.argv[1:] or cases.KINDS
    unknown = [k for k in kinds if k not in cases.KINDS]
    if unknown:
        sys.exit(f"unknown golden kind(s) {unknown}: choose from {list(cases.KINDS)}")
    for kind in kinds:
        path = cases.golden_path(kind)
        doc = {"deepspeed": deepspeed.__version__, "recorded_by": "tests/data/" + Path(__file__).name,
               "traces": cases.deepspeed_traces(kind)}
        path.write_text(readable_json(doc) + "\n")
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
