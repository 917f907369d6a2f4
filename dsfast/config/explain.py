"""`python -m dsfast.config ds_config.json --explain`: every effective value and where it came from.

Origins:
  user        the config sets it (under the key's name or its DeepSpeed alias)
  auto        "auto": the framework (Hugging Face Trainer / accelerate) fills it in before the engine sees the
              config; shown with the value dsfast would use without it
  derived     computed from other values: the batch triple (train = micro x accumulation x world), a deprecated key
  default     DeepSpeed 0.19.8's default, with the release that changed it where it changed in 0.19.x
  dsfast      dsfast's own choice where it deliberately differs from DeepSpeed 0.19.8, or a key DeepSpeed lacks
Also the process group's timeout, which comes from the environment, not the config.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Optional, Tuple

from pydantic import BaseModel

from .loader import parse_config
from .zeropp import explain_note

BATCH = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

# DeepSpeed 0.19.x default changes: dotted path -> (release, previous default)
DEFAULT_CHANGES = {
    "gradient_clipping": ("0.19.3", 0.0),
    "zero_optimization.offload_optimizer.pin_memory": ("0.19.5", False),
    "zero_optimization.offload_param.pin_memory": ("0.19.5", False),
}

# Where dsfast deliberately treats a key differently from DeepSpeed 0.19.8 (the README lists them too), said after
# the origin whoever set the value: path -> (note, applies(config, set by the user))
DSFAST_CHOICES = {
    "fp16.loss_scale_window": ("the dynamic scale doubles after loss_scale_window overflow-free steps, as "
                               "documented (DeepSpeed 0.19.8 doubles one step later)",
                               lambda cfg, given: cfg.fp16.enabled),
    "zero_optimization.cpu_offload_use_pin_memory": ("honoured for the offload it maps to (DeepSpeed 0.19.8 "
                                                     "ignores the deprecated key and pins)",
                                                     lambda cfg, given: given),
    "zero_optimization.offload_optimizer.device": (
        '"auto" is dsfast\'s own value: initialize() picks "none", "cpu" or "nvme" (nvme only with nvme_path) '
        "from this model's size, the world size and the machine's free memory, the fastest that fits, and logs "
        "it (with state_precision \"int8\": \"cpu\" or \"nvme\", from the plan's int8 rows; `dsfast plan` shows "
        "the options)",
        lambda cfg, given: cfg.zero_optimization.offload_optimizer_device == "auto"),
}
# "auto" values that are dsfast's own (DSFAST_CHOICES explains them), not a framework's placeholder
DSFAST_AUTO = {("zero_optimization", "offload_optimizer", "device")}

# Keys DeepSpeed does not have
DSFAST_KEYS = {
    "checkpoint.async_save": "dsfast's own key: write checkpoints from host copies in the background",
    "checkpoint.timeout_s": "dsfast's own key: how long a save/load waits for the other ranks",
    "hang_watch.enabled": "dsfast's own key: say which rank is where when the ranks stop agreeing (a hang)",
    "hang_watch.after_s": "dsfast's own key: seconds a rank waits in one collective before the ranks' positions "
                          "are compared ($DSFAST_HANG_WATCH_S wins; below the process group's timeout)",
    "zero_optimization.offload_optimizer.state_precision": "dsfast's own key: the host optimizer's Adam moments, "
                                                           "fp32 or int8 (8-bit block-wise: CPUAdam8bit)",
    "zero_optimization.offload_optimizer.overlap_step": "dsfast's own key: the host step runs behind the next "
                                                        "forward, states on cpu or nvme (off by default: code "
                                                        "reading param.data between step() and the next forward "
                                                        "would see half-updated values)",
}


def _auto_paths(data: Any, prefix: Tuple = ()) -> List[Tuple]:
    if isinstance(data, dict):
        out = []
        for key, value in data.items():
            out += _auto_paths(value, prefix + (key,))
        return out
    return [prefix] if isinstance(data, str) and data == "auto" and prefix not in DSFAST_AUTO else []


def _without(data: dict, paths: List[Tuple]) -> dict:
    data = copy.deepcopy(data)
    for path in paths:
        node = data
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return data


def _given(raw: Optional[dict], name: str, alias: Optional[str]):
    """(key the user wrote, value) at this level, or (None, None)."""
    if not isinstance(raw, dict):
        return None, None
    for key in (name, alias):
        if key is not None and key in raw:
            return key, raw[key]
    return None, None


def _walk(model: BaseModel, raw: Optional[dict], autos: set, prefix: Tuple, out: List[Tuple[str, Any, str]],
          raw_prefix: Tuple = (), root: Optional[BaseModel] = None):
    """Rows of `model`'s fields; raw: the user's mapping at this level; raw_prefix: its path as the user wrote it
    (aliases included), which is what the "auto" paths are."""
    for name, field in type(model).model_fields.items():
        path = prefix + (name,)
        dotted = ".".join(path)
        value = getattr(model, name)
        key, given = _given(raw, name, field.alias)
        written = raw_prefix + (key,) if key else None
        if isinstance(value, BaseModel):
            if written in autos:
                out.append((dotted, "auto", "auto: the framework fills it in"))
                continue
            if key is None and name in model.model_fields_set:
                out.append((dotted, "(section)", "derived: from a deprecated key"))
            _walk(value, given if isinstance(given, dict) else None, autos, path, out, written or (), root or model)
            continue
        if written in autos:
            origin = "auto: the framework fills it in (without it: this value)"
        elif key is not None:
            origin = "user" if key == name else f"user (as {key!r})"
        elif name in model.model_fields_set:
            origin = "derived: from a deprecated key"
        elif dotted in DSFAST_KEYS:
            origin = DSFAST_KEYS[dotted]
        elif dotted in DEFAULT_CHANGES:
            since, before = DEFAULT_CHANGES[dotted]
            origin = f"default: DeepSpeed 0.19.8 (since {since}; {before!r} before)"
        else:
            origin = "default: DeepSpeed 0.19.8"
        note, applies = DSFAST_CHOICES.get(dotted, (None, None))
        if note and applies(root or model, key is not None):
            origin += "; dsfast: " + note
        meaning = explain_note(dotted, root or model)   # ZeRO++ keys: accepted as what (config/zeropp.py)
        if meaning:
            origin += "; dsfast: " + meaning
        out.append((dotted, value, origin))


def _batch_origins(cfg, raw: dict, autos: set) -> Dict[str, str]:
    given = [k for k in BATCH if k in raw and (k,) not in autos]
    t, m, g, w = cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps, \
        cfg.world_size
    how = {"train_batch_size": f"derived: micro {m} x accumulation {g} x world {w}",
           "train_micro_batch_size_per_gpu": f"derived: {t} / (accumulation {g} x world {w})",
           "gradient_accumulation_steps": f"derived: {t} / (micro {m} x world {w})"}
    if "gradient_accumulation_steps" not in given and len(given) < 2:
        how["gradient_accumulation_steps"] = "default: 1 (DeepSpeed's rule when it cannot be derived)"
    out = {}
    for k in BATCH:
        if (k,) in autos:
            out[k] = "auto: the framework fills it in"
        else:
            out[k] = "user" if k in given else how[k]
    return out


def explain(data: dict, world_size: int = 1, source: Optional[str] = None, env=None) -> List[Tuple[str, Any, str]]:
    """[(dotted key, effective value, origin)] for a config mapping (the one the user wrote, "auto" allowed)."""
    from dsfast.comm.init import DEFAULT_TIMEOUT_MIN, default_timeout
    autos = set(_auto_paths(data))
    stripped = _without(data, sorted(autos))
    placeholder = not any(k in stripped for k in BATCH)
    if placeholder and any((k,) in autos for k in BATCH):
        stripped["train_micro_batch_size_per_gpu"] = 1     # validation only: the framework sets the real triple
    cfg = parse_config(stripped, world_size=world_size, source=source)
    out: List[Tuple[str, Any, str]] = []
    _walk(cfg, data, autos, (), out)
    batch = _batch_origins(cfg, data, autos)
    out = [(k, "auto" if batch.get(k, "").startswith("auto") else v, batch.get(k, o)) for k, v, o in out]
    env = os.environ if env is None else env
    seconds = default_timeout(env).total_seconds()
    which = next((n for n in ("DSFAST_TIMEOUT_S", "DEEPSPEED_TIMEOUT") if env.get(n) is not None), None)
    out.append(("(environment) process group timeout [s]", seconds,
                f"user (environment {which})" if which else
                f"default: DeepSpeed 0.19.8 ({DEFAULT_TIMEOUT_MIN} minutes; DEEPSPEED_TIMEOUT minutes overrides)"))
    from dsfast.comm.hang_watch import ENV as HANG_ENV, resolve_after_s
    after = resolve_after_s(cfg, seconds, env)
    out.append(("(environment) hang watch after [s]", after,
                f"user (environment {HANG_ENV})" if env.get(HANG_ENV, "").strip() else
                "dsfast: compare the ranks' positions after this wait in one collective (0: off; config "
                f"hang_watch, environment {HANG_ENV})"))
    return out


def format_explanation(rows: List[Tuple[str, Any, str]]) -> List[str]:
    width = max(len(f"{k} = {v!r}") for k, v, _ in rows) + 2
    width = min(width, 64)
    return [f"  {f'{k} = {v!r}':<{width}} {o}" for k, v, o in rows]
