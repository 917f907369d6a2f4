"""Environment files (.deepspeed_env, .dsfast_env) and the variables the launcher exports to every rank.

Lookup and precedence (documented rule): candidates are read in this order, and a file read later overrides the
same key from a file read earlier, so the most specific place wins:
    1. $DS_ENV_FILE (a path)                       lowest
    2. ~/.deepspeed_env, then ~/.dsfast_env
    3. ./.deepspeed_env, then ./.dsfast_env         highest (current directory, .dsfast_env over .deepspeed_env)
Every existing candidate is read (the same file is read once). Variables from env files override variables of the
same name in the launcher's own environment.

Line format: `KEY=VALUE` (an optional leading `export ` is accepted), blank lines and `#` comment lines allowed.
KEY must be a shell-style name. VALUE is everything after the first `=`, with surrounding whitespace stripped;
if the whole value is wrapped in one pair of matching quotes ('...' or "..."), that pair is removed. Nothing else
is interpreted: no escapes, no $expansion, inner quotes, spaces and `;` are kept as written.
"""
import os
import re
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional

from .errors import LaunchError

ENV_FILE_NAMES = (".deepspeed_env", ".dsfast_env")
# Variables forwarded from the launcher's environment to remote nodes (DeepSpeed's prefixes, plus ours).
EXPORT_PREFIXES = ("NCCL", "PYTHON", "MLFLOW", "MV2", "UCX", "DSFAST", "OMP_NUM_THREADS", "TORCH_")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_env_text(text: str, source: str) -> "OrderedDict[str, str]":
    out: Dict[str, str] = OrderedDict()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise LaunchError(f"env file {source} line {lineno} ({raw.strip()!r}): expected KEY=VALUE with KEY "
                              "made of letters, digits and '_' (not starting with a digit)")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def env_file_candidates(cwd: Optional[str] = None, home: Optional[str] = None,
                        environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Candidate paths, lowest precedence first (see the module docstring)."""
    environ = os.environ if environ is None else environ
    cwd = os.getcwd() if cwd is None else cwd
    home = os.path.expanduser("~") if home is None else home
    paths = []
    if environ.get("DS_ENV_FILE"):
        paths.append(os.path.expanduser(environ["DS_ENV_FILE"]))
    paths += [os.path.join(home, n) for n in ENV_FILE_NAMES]
    paths += [os.path.join(cwd, n) for n in ENV_FILE_NAMES]
    return paths


def read_env_files(cwd=None, home=None, environ=None):
    """Merge every existing env file. Returns (variables, [files read, in order])."""
    environ = os.environ if environ is None else environ
    merged: Dict[str, str] = OrderedDict()
    read, seen = [], set()
    explicit = environ.get("DS_ENV_FILE")
    for path in env_file_candidates(cwd, home, environ):
        real = os.path.realpath(path)
        if real in seen:
            continue
        if not os.path.isfile(path):
            if explicit and path == os.path.expanduser(explicit):
                raise LaunchError(f"DS_ENV_FILE={explicit} does not exist or is not a file")
            continue
        seen.add(real)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise LaunchError(f"cannot read env file {path}: {e}") from None
        merged.update(parse_env_text(text, path))
        read.append(path)
    return merged, read


def exported_env(environ: Mapping[str, str], file_vars: Mapping[str, str]) -> "OrderedDict[str, str]":
    """What every rank on every node receives on top of its node's own environment."""
    out: Dict[str, str] = OrderedDict(
        (k, v) for k, v in sorted(environ.items()) if k.startswith(EXPORT_PREFIXES))
    out.update(file_vars)
    return out
