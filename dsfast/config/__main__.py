"""Check a ds_config before launching: `python -m dsfast.config ds_config.json [--world-size N]`.

Prints the resolved batch sizes, precision, ZeRO stage, optimizer and schedule, and every setting dsfast ignores;
or the problems, one per line, and exit status 1. `--defaults` prints every key with its default instead;
`--explain` every effective value with where it came from (explain.py).
"""
from __future__ import annotations

import argparse
import sys
import typing
from typing import List, Optional, Type

from pydantic import BaseModel

from .base import models_in
from .ds_config import DsConfig
from .errors import DsConfigError
from .loader import load_config, read_json_file
from .optimizer import AdagradParams, AdamParams, LionParams, SGDParams
from .scheduler import SCHEDULER_PARAMS


def _default_lines(cls: Type[BaseModel], prefix: str = "") -> List[str]:
    lines = []
    for name, field in cls.model_fields.items():
        path = f"{prefix}{name}"
        subs = models_in(field.annotation)
        if subs and not typing.get_args(field.annotation) and field.default_factory is not None:
            lines.extend(_default_lines(subs[0], path + "."))
            continue
        default = "required" if field.is_required() else repr(field.get_default(call_default_factory=True))
        bounds = " ".join(f"{sym} {getattr(m, attr)}" for m in field.metadata
                          for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if hasattr(m, attr))
        alias = f" (alias {field.alias})" if field.alias else ""
        lines.append(f"{path} = {default}{alias}" + (f"  [{bounds}]" if bounds else ""))
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsfast.config", description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", help="path to ds_config.json")
    parser.add_argument("--world-size", type=int, default=1, help="data-parallel world size (default 1)")
    parser.add_argument("--defaults", action="store_true", help="print every key with its default and bounds")
    parser.add_argument("--explain", action="store_true",
                        help="print every effective value with its origin: user, auto, derived, DeepSpeed 0.19.8's "
                             "default (and the release that changed it), or dsfast's own choice")
    args = parser.parse_args(argv)
    if args.defaults:
        lines = _default_lines(DsConfig)
        for name, model in (("Adam/AdamW", AdamParams), ("SGD", SGDParams), ("Adagrad", AdagradParams),
                            ("Lion", LionParams)):
            lines += _default_lines(model, f'optimizer.params ("type": "{name}") ')
        for name, model in SCHEDULER_PARAMS.items():
            lines += _default_lines(model, f'scheduler.params ("type": "{name}") ')
        print("\n".join(lines))
        return 0
    if not args.config:
        parser.error("give a config file, or --defaults")
    if args.explain:
        return _explain(args.config, args.world_size)
    try:
        cfg = load_config(args.config, world_size=args.world_size, log_ignored=False)
    except DsConfigError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"ok: {args.config} (world size {cfg.world_size})")
    print(f"  train_batch_size={cfg.train_batch_size} = micro {cfg.train_micro_batch_size_per_gpu} x "
          f"accumulation {cfg.gradient_accumulation_steps} x world {cfg.world_size}")
    print(f"  precision={cfg.precision} zero_stage={cfg.zero_stage} gradient_clipping={cfg.gradient_clipping}")
    if cfg.precision == "fp16":
        f = cfg.fp16
        scale = (f"dynamic from 2**{f.initial_scale_power}, window {f.loss_scale_window}, hysteresis {f.hysteresis}"
                 f", floor {f.min_loss_scale:g}" if f.dynamic else f"static {f.loss_scale:g}")
        print(f"  loss scale: {scale}")
    if cfg.optimizer is not None:
        print(f"  optimizer={cfg.optimizer.type} {cfg.optimizer.torch_kwargs()}"
              + (" (decoupled weight decay)" if cfg.optimizer.adamw_mode else ""))
    if cfg.scheduler is not None:
        print(f"  scheduler={cfg.scheduler.type} {cfg.scheduler.params.model_dump()}")
    for note in cfg.ignored_settings():
        print(f"  note: {note}")
    return 0


def _explain(path: str, world_size: int) -> int:
    from .explain import explain, format_explanation
    try:
        rows = explain(read_json_file(path), world_size=world_size, source=path)
    except (DsConfigError, ValueError) as err:    # ValueError: a bad DEEPSPEED_TIMEOUT / DSFAST_TIMEOUT_S
        print(err, file=sys.stderr)
        return 1
    print(f"{path} (world size {world_size}): every effective value and its origin")
    print("\n".join(format_explanation(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
