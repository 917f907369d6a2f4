"""load_config: find the ds_config (path, dict or args), parse it, validate it, report ignored settings."""
from __future__ import annotations

import base64
import copy
import json
import logging
import os
from typing import Any, Mapping, Optional

from pydantic import ValidationError

from . import jsonish
from .base import translate
from .ds_config import DsConfig
from .errors import DsConfigError, dotted, format_problems

logger = logging.getLogger("dsfast.config")

_ARG_NAMES = ("deepspeed_config", "dsfast_config", "deepscale_config")


def _from_args(args) -> Optional[tuple]:
    """(attribute name, value) of the config path carried by an argparse namespace, or None."""
    found = [(n, getattr(args, n)) for n in _ARG_NAMES if getattr(args, n, None) is not None]
    if len(found) > 1 and len({str(v) for _, v in found}) > 1:
        shown = ", ".join(f"args.{n}={v!r}" for n, v in found)
        raise DsConfigError(f"two different configs given on the command line ({shown}); pass one")
    return found[0] if found else None


def read_json_file(path: str) -> dict:
    """Read a JSON config file with errors that name the file (and line/column for syntax errors)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        decoded = _base64_config(path)
        if decoded is not None:
            return decoded
        raise DsConfigError(f"ds_config file not found: {path!r} (cwd: {os.getcwd()})", source=path)
    if os.path.isdir(path):
        raise DsConfigError(f"ds_config path is a directory, not a JSON file: {path!r}", source=path)
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise DsConfigError(f"cannot read ds_config file {path!r}: {err}", source=path) from None
    try:
        data = jsonish.loads(text, object_pairs_hook=_no_duplicate_keys(path))
    except json.JSONDecodeError as err:
        line_text = text.splitlines()[err.lineno - 1] if 0 < err.lineno <= len(text.splitlines()) else ""
        raise DsConfigError(
            f"ds_config file {path!r} is not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}"
            + (f"\n    {line_text}\n    {' ' * (err.colno - 1)}^" if line_text else ""), source=path) from None
    if not isinstance(data, dict):
        raise DsConfigError(f"ds_config file {path!r} must hold a JSON object, not {type(data).__name__}",
                            source=path)
    return data


def _base64_config(text: str) -> Optional[dict]:
    """DeepSpeed also accepts the config as a urlsafe-base64 JSON string (its launcher passes it that way)."""
    if len(text) < 8 or any(c in text for c in "/\\. "):
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _no_duplicate_keys(path):
    # json keeps the last of two equal keys silently; a repeated key is almost always an editing mistake.
    def hook(pairs):
        seen = {}
        for k, v in pairs:
            if k in seen:
                raise DsConfigError(f"ds_config file {path!r}: key {k!r} appears twice in the same object",
                                    source=path)
            seen[k] = v
        return seen
    return hook


def parse_config(data: Mapping[str, Any], world_size: int = 1, source: Optional[str] = None) -> DsConfig:
    """Validate a config mapping into a DsConfig (batch sizes resolved for `world_size`)."""
    if isinstance(data, DsConfig):
        data = data.raw     # re-resolve from what the user wrote (e.g. for another world size)
    if not isinstance(data, Mapping):
        raise DsConfigError(f"a ds_config must be a dict or a path to a JSON file (got {type(data).__name__})")
    try:
        cfg = DsConfig.model_validate(dict(data), context={"world_size": int(world_size)})
    except ValidationError as err:
        problems = [(dotted(loc), msg) for loc, msg in translate(err, DsConfig)]
        raise DsConfigError(format_problems(problems, source), problems, source) from None
    cfg._source = source
    cfg._raw = copy.deepcopy(dict(data))
    return cfg


def load_config(config: Any = None, config_params: Optional[Mapping] = None, args: Any = None,
                world_size: int = 1, log_ignored: bool = True) -> DsConfig:
    """The ds_config from exactly one of: `config` (path or dict), `config_params` (dict),
    `args.deepspeed_config` / `args.dsfast_config` (path). Two at once is an error."""
    sources = []
    if config is not None:
        sources.append(("config", config))
    if config_params is not None:
        sources.append(("config_params", config_params))
    from_args = _from_args(args) if args is not None else None
    if from_args is not None:
        sources.append((f"args.{from_args[0]}", from_args[1]))
    if not sources:
        raise DsConfigError("no ds_config given: pass config= (a path or a dict), config_params=, or "
                            "--deepspeed_config <file> on the command line (dsfast.add_config_arguments)")
    if len(sources) > 1:
        names = " and ".join(n for n, _ in sources)
        raise DsConfigError(f"two ds_configs given at once ({names}); pass exactly one")
    name, value = sources[0]
    if isinstance(value, (str, os.PathLike)):
        source = os.fspath(value)
        data = read_json_file(source)
    elif isinstance(value, (Mapping, DsConfig)):
        source, data = None, value
    else:
        raise DsConfigError(f"{name} must be a path to a JSON file or a dict (got {type(value).__name__})")
    cfg = parse_config(data, world_size=world_size, source=source)
    if log_ignored and _is_rank0():
        for note in cfg.ignored_settings():
            logger.warning("ds_config: %s", note)
    return cfg


def _is_rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"
