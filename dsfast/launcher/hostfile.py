"""Hostfile parsing: one `host slots=N` per line, `#` comments and blank lines allowed.

The order of the lines is the rank order: the first host's slots get ranks 0..N-1 and so on.
Every rejected form raises LaunchError naming the file and the line.
"""
import os
import re
from collections import OrderedDict
from typing import Dict

from .errors import LaunchError

DEFAULT_HOSTFILE = "/job/hostfile"

_LINE = re.compile(r"^(?P<host>\S+)\s+slots=(?P<slots>\S+)$")


def parse_hostfile_text(text: str, source: str = "<hostfile>") -> "OrderedDict[str, int]":
    """Parse hostfile text into {host: slot count}, in file order."""
    hosts: Dict[str, int] = OrderedDict()
    first_seen: Dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"hostfile {source} line {lineno} ({raw.strip()!r})"
        m = _LINE.match(line)
        if m is None:
            raise LaunchError(f"{where}: expected 'HOSTNAME slots=N', e.g. 'worker-0 slots=8'")
        host, slots = m.group("host"), m.group("slots")
        if "slots=" in host or "=" in host:
            raise LaunchError(f"{where}: expected 'HOSTNAME slots=N', e.g. 'worker-0 slots=8'")
        if not slots.isdigit() or int(slots) < 1:
            raise LaunchError(f"{where}: slots must be a positive integer, got {slots!r}")
        if host in hosts:
            raise LaunchError(f"{where}: host {host!r} is listed twice (first on line {first_seen[host]}); "
                              "give each host one line with its total slots")
        hosts[host] = int(slots)
        first_seen[host] = lineno
    if not hosts:
        raise LaunchError(f"hostfile {source} lists no hosts (only blank lines or comments); "
                          "add lines like 'worker-0 slots=8' or drop --hostfile to run on this machine")
    return hosts


def read_hostfile(path: str) -> "OrderedDict[str, int]":
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise LaunchError(f"cannot read hostfile {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise LaunchError(f"hostfile {path} is not UTF-8 text") from None
    return parse_hostfile_text(text, path)


def find_hostfile(path: str, explicit: bool):
    """The hostfile's {host: slots}, or None when the default path does not exist (run on this machine).

    A hostfile named explicitly with --hostfile must exist; the default /job/hostfile may be absent.
    """
    if not explicit and not os.path.exists(path):
        return None
    return read_hostfile(path)
