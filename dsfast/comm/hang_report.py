"""The hang watch's words: one rank's position (published to the store), and the verdict over every rank's.

Runs in the watch's thread only, never on the training path: tags (where.py) hold objects, turned into text here.
An entry is a dict: beat (a heartbeat counter), seq / inside / what (the collective, where.py), site / step / micro /
forwards / backwards / training (the engine call), gone (the rank's program ended and it left the watch).
"""
import json


def param_names(model):
    """{id(parameter): qualified name} of `model` (what gathers and buckets are reported by)."""
    return {} if model is None else {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}


def _params(objs, names):
    out = []
    for o in objs:
        p = getattr(o, "param", o)
        n = names.get(id(p))
        if n is not None and n not in out:
            out.append(n)
    return out


def _module_of(params):
    """The deepest module every parameter name lies under, and the names relative to it."""
    parts = [n.split(".")[:-1] for n in params]
    common = parts[0]
    for p in parts[1:]:
        k = 0
        while k < min(len(common), len(p)) and common[k] == p[k]:
            k += 1
        common = common[:k]
    rel = [".".join(n.split(".")[len(common):]) for n in params]
    return ".".join(common), rel


def _listed(items, most=4):
    return ", ".join(items[:most]) + (f", ... ({len(items)} in all)" if len(items) > most else "")


def describe_what(what, names):
    """The tag of a collective (where.py) in words."""
    if not what:
        return "in a collective"
    kind = what[0]
    if kind == "gather":
        params = _params(what[1], names)
        if not params:
            return f"gathering {len(what[1])} stage-3 parameter(s)"
        module, rel = _module_of(params)
        return f"gathering `{module or '(the root module)'}` ({_listed(rel)})"
    if kind == "reduce":
        b = what[1]
        if b is None:
            return "at a gradient reduction's rendezvous"
        params = _params([m for _, m in getattr(b, "members", ())], names)
        return f"reducing gradient bucket {b.index}" + (f" ({_listed(params, 2)})" if params else "")
    fixed = {"publish": "publishing the updated stage-3 parameters to the other ranks",
             "decision": "in the step decision's all-reduce (gradient norm / overflow)",
             "nvme": "in the NVMe swap's agreement after its I/O",
             "updated shards": "gathering the updated parameter shards after the optimizer step",
             "gather check": "in stage 3's check, at the end of backward, that every rank gathered the same parameters",
             "exit": "at the end of its program, waiting for the other ranks to finish",
             "initialize": "in initialize()'s broadcast of rank 0's weights",
             "save_16bit_model": "in save_16bit_model's barrier",
             "grad norm": "in the gradient norm's all-reduce (deepspeed.runtime.utils)",
             "shared tables": "agreeing on the same-host shared-memory tables in initialize()"}
    if kind in fixed:
        return fixed[kind]
    if kind in ("zero.Init", "GatheredParameters", "full parameter"):
        params = _params(what[1], names)
        return f"in {kind}'s collective" + (f" for `{params[0]}`" if params else "")
    if kind == "checkpoint":
        return f"at {what[1]}'s rendezvous {what[2]!r}"
    if kind == "deepspeed.comm":
        return f"in deepspeed.comm.{what[1]}"
    return f"in {what!r}"


def entry(w, beat, names, gone=False, pos=None):
    """This rank's published entry (bytes) from where.WHERE; pos: (seq, tag) of the collective it waits in
    (where.position()), None when it waits in none."""
    seq, what = pos if pos is not None else (w.seq, None)
    return json.dumps({"beat": beat, "seq": seq, "inside": pos is not None, "what": describe_what(what, names),
                       "site": w.site, "step": w.step, "micro": w.micro, "forwards": w.forwards,
                       "backwards": w.backwards, "evals": w.evals, "training": w.training, "gone": gone}).encode()


def _site(e):
    site, step, micro = e.get("site"), e.get("step"), e.get("micro")
    if site in ("forward", "backward"):
        mode = "" if e.get("training", True) or site != "forward" else " in eval mode"
        return f" in {site}{mode} (global_steps {step}, micro_steps {micro})"
    if site in (None, "exit"):
        return ""
    return f" in {'engine.' if site == 'step' else ''}{site} (global_steps {step})"


def position(e):
    """`is <what> in <call> (...)` for a live rank."""
    return f"is {e['what']}{_site(e)}" if e.get("inside") else f"is computing{_site(e)} (in no collective)"


def _ranks(rs):
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _group(lines):
    """{text: [ranks]} in rank order, so a thousand ranks in the same place make one line."""
    out = {}
    for r, text in lines:
        out.setdefault(text, []).append(r)
    return [f"{_ranks(rs)} {'are ' + text[3:] if len(rs) > 1 and text.startswith('is ') else text}"
            for text, rs in out.items()]


def _counts(entries, key):
    return ", ".join(f"rank {r}: {e[key]}" for r, e in sorted(entries.items()))


def cause(live, dead, gone):
    """Why the ranks disagree, from their counters."""
    if dead:
        return f"{_ranks(sorted(dead))} died"
    if any(e.get("site") in ("save_checkpoint", "load_checkpoint") for e in live.values()) and \
            len({e.get("site") for e in live.values()}) > 1:
        return "save_checkpoint / load_checkpoint must be called on every rank at the same point"
    if len({e.get("evals") for e in live.values()}) > 1:
        return (f"the ranks ran different numbers of forwards in eval mode ({_counts(live, 'evals')}): under ZeRO "
                "stage 3 every rank must run the same forwards, in training and in eval")
    for key, what in (("forwards", "forward"), ("backwards", "backward")):
        if len({e[key] for e in live.values()}) > 1:
            return f"the ranks ran different numbers of {what} passes ({_counts(live, key)})"
    if gone:
        return f"{_ranks(sorted(gone))} left the job while the others still wait"
    gathered = {}
    for r, e in sorted(live.items()):
        if e["what"].startswith("gathering `"):
            gathered.setdefault(e["what"].split("`")[1], []).append(r)
    lone = next(((m, rs) for m, rs in gathered.items() if len(rs) < len(live)), None)
    if lone:
        return (f"the ranks issued different collectives: `{lone[0]}` is gathered on {_ranks(lone[1])} only (a "
                "module that ran on some ranks only: a data-dependent branch under ZeRO stage 3?)")
    return ("the ranks issued different collectives: a module or parameter used on some ranks only (a "
            "data-dependent branch under ZeRO stage 3?) or a collective called on some ranks only")


def classify(before, after, world):
    """({rank: entry} of the dead, of the gone (program ended), of the live) from two reads of the entries."""
    dead, gone, live = {}, {}, {}
    for r in range(world):
        a, b = before.get(r), after.get(r)
        if b is None:
            continue                  # never published: started late or runs no watch; nothing to say
        if b.get("gone"):
            gone[r] = b
        elif a is not None and a["beat"] == b["beat"]:
            dead[r] = b
        else:
            live[r] = b
    return dead, gone, live


def describe(dead, gone, live, dead_after_s):
    """Every rank's position, ranks in the same place on one line."""
    parts = _group([(r, position(e)) for r, e in sorted(live.items())])
    parts += [f"{_ranks([r])} is dead (no heartbeat for {dead_after_s:.0f} s; it was last {position(e)[3:]})"
              for r, e in sorted(dead.items())]
    parts += [f"{_ranks([r])} has ended its program" for r in sorted(gone)]
    return "; ".join(parts)


def verdict(before, after, world, dead_after_s):
    """The hang message, or None when this is no hang (yet). `before` / `after`: {rank: entry dict} read
    `dead_after_s` apart. A rank whose heartbeat did not move is dead; a live rank that is in no collective, or
    whose seq moved, is working (merely slow): no verdict. Ranks all waiting in the same collective (same seq and
    tag) are slow together, not hung on each other: no verdict either."""
    dead, gone, live = classify(before, after, world)
    if not dead:
        if not live or any(not e["inside"] or before[r]["seq"] != e["seq"] for r, e in live.items()):
            return None
        if len({(e["seq"], e["what"]) for e in live.values()}) == 1 and not gone:
            return None
    return f"{describe(dead, gone, live, dead_after_s)}: {cause(live, dead, gone)}"
