"""--include / --exclude / --num_nodes / --num_gpus: which slots of which hosts take part.

Spec syntax (DeepSpeed's): NODE_SPEC[@NODE_SPEC...], NODE_SPEC = HOST[:SLOT[,SLOT...]].
`worker-2:0,1@worker-3` means slots 0 and 1 of worker-2 and every slot of worker-3.
The result keeps hostfile order for hosts and ascending order for slots, whatever order the spec uses,
because that order decides the ranks.
"""
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional

from .errors import LaunchError

Resources = "OrderedDict[str, List[int]]"


def parse_node_spec(spec: str, option: str) -> "OrderedDict[str, Optional[List[int]]]":
    """Parse an include/exclude spec into {host: sorted slots or None for 'all slots'}."""
    if spec is None or not spec.strip():
        raise LaunchError(f"{option} is empty; expected HOST[:SLOT,...][@HOST...], e.g. 'worker-0:0,1@worker-1'")
    out: Dict[str, Optional[List[int]]] = OrderedDict()
    for part in spec.strip().split("@"):
        host, sep, slot_text = part.partition(":")
        host = host.strip()
        if not host:
            raise LaunchError(f"{option} {spec!r}: empty host name in {part!r}; "
                              "expected HOST[:SLOT,...] separated by '@'")
        slots: Optional[List[int]] = None
        if sep:
            slots = []
            for tok in slot_text.split(","):
                tok = tok.strip()
                if not tok.isdigit():
                    raise LaunchError(f"{option} {spec!r}: slot {tok!r} of host {host!r} is not a non-negative "
                                      "integer; expected e.g. 'worker-0:0,1'")
                slots.append(int(tok))
        if host in out:  # the same host twice: union of what was asked (None = all wins)
            prev = out[host]
            slots = None if prev is None or slots is None else prev + slots
        out[host] = None if slots is None else sorted(set(slots))
    return out


def _check_known(spec, hosts: Mapping[str, int], option: str, source: str):
    for host, slots in spec.items():
        if host not in hosts:
            raise LaunchError(f"{option} names host {host!r}, which is not in {source} "
                              f"(hosts: {', '.join(hosts)})")
        for s in slots or ():
            if s >= hosts[host]:
                raise LaunchError(f"{option} names slot {s} of host {host!r}, which has slots "
                                  f"0..{hosts[host] - 1} in {source}")


def select_resources(hosts: Mapping[str, int], include: Optional[str] = None, exclude: Optional[str] = None,
                     num_nodes: int = -1, num_gpus: int = -1, source: str = "the hostfile") -> Resources:
    """Apply the filters to {host: slot count} and return {host: [slot ids]} in hostfile order."""
    if include is not None and exclude is not None:
        raise LaunchError("--include and --exclude are mutually exclusive; use one of them")
    if (include is not None or exclude is not None) and (num_nodes != -1 or num_gpus != -1):
        which = "--include" if include is not None else "--exclude"
        other = "--num_nodes" if num_nodes != -1 else "--num_gpus/--num_procs"
        raise LaunchError(f"{which} cannot be combined with {other}; pick slots with one or the other")
    if num_nodes != -1 and num_nodes < 1:
        raise LaunchError(f"--num_nodes must be a positive integer, got {num_nodes}")
    if num_gpus != -1 and num_gpus < 1:
        raise LaunchError(f"--num_gpus/--num_procs must be a positive integer, got {num_gpus}")

    full = OrderedDict((h, list(range(n))) for h, n in hosts.items())
    if include is not None:
        spec = parse_node_spec(include, "--include")
        _check_known(spec, hosts, "--include", source)
        result = OrderedDict((h, full[h] if spec[h] is None else spec[h]) for h in hosts if h in spec)
    elif exclude is not None:
        spec = parse_node_spec(exclude, "--exclude")
        _check_known(spec, hosts, "--exclude", source)
        result = OrderedDict()
        for h, slots in full.items():
            if h in spec:
                drop = set(slots) if spec[h] is None else set(spec[h])
                slots = [s for s in slots if s not in drop]
            if slots:
                result[h] = slots
    else:
        result = full
        if num_nodes != -1:
            if num_nodes > len(result):
                raise LaunchError(f"--num_nodes {num_nodes} but {source} has only {len(result)} host(s): "
                                  f"{', '.join(result)}")
            result = OrderedDict(list(result.items())[:num_nodes])
        if num_gpus != -1:
            short = [f"{h} ({len(s)})" for h, s in result.items() if len(s) < num_gpus]
            if short:
                raise LaunchError(f"--num_gpus {num_gpus} but these hosts have fewer slots in {source}: "
                                  f"{', '.join(short)}")
            result = OrderedDict((h, s[:num_gpus]) for h, s in result.items())
    if not result:
        raise LaunchError(f"--exclude {exclude!r} leaves no slots to run on")
    return result
