"""Strict pydantic base model and the translation of pydantic errors into DsConfigError lines.

Every section of the schema derives from StrictModel: unknown keys are rejected (extra="forbid"), and the
translator turns that into "fp16.loss_scale_windw: unknown key; did you mean 'loss_scale_window'?".
"""
from __future__ import annotations

import typing
from typing import Any, List, Optional, Tuple, Type

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from .errors import dotted, suggest

NESTED = "dsfast_nested"   # error type carrying already-translated problems of a sub-schema
PLAIN = "dsfast"           # error type whose message is final


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True,
                              validate_assignment=False, arbitrary_types_allowed=False)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any):
        # pydantic's lax mode reads true as 1; in a config that is a mistake ("train_batch_size": true). A list or
        # object where a plain number goes gets the same plain words instead of pydantic's type name.
        if isinstance(data, dict):
            bad = []
            for name, field in cls.model_fields.items():
                for key in (name, field.alias):
                    if key in data and isinstance(data[key], bool) and _is_numeric(field.annotation):
                        bad.append(((key,), f"must be a number, not {str(data[key]).lower()}"))
                    elif key in data and isinstance(data[key], (list, dict)) and field.annotation in (int, float):
                        kind = "a list" if isinstance(data[key], list) else "an object"
                        bad.append(((key,), f"must be a number, not {kind} ({data[key]!r})"))
            if bad:
                raise nested_error(bad)
        return data

    @classmethod
    def known_keys(cls) -> List[str]:
        keys = []
        for name, field in cls.model_fields.items():
            keys.append(name)
            if field.alias:
                keys.append(field.alias)
        return keys


def plain_error(message: str) -> PydanticCustomError:
    """An error whose text is shown as is (no 'Value error,' prefix)."""
    return PydanticCustomError(PLAIN, "{message}", {"message": message})


def nested_error(problems: List[Tuple[Tuple, str]]) -> PydanticCustomError:
    """Carry problems of a sub-schema (e.g. scheduler.params for the chosen type) up with their own paths."""
    return PydanticCustomError(NESTED, "{summary}", {"summary": "; ".join(m for _, m in problems),
                                                      "problems": problems})


def _is_numeric(annotation) -> bool:
    """int/float (possibly Optional or a per-group list) and not bool."""
    if annotation in (int, float):
        return True
    args = typing.get_args(annotation)
    return bool(args) and bool not in args and any(_is_numeric(a) for a in args if a is not type(None))


def models_in(annotation) -> List[Type[BaseModel]]:
    """The BaseModel classes reachable inside Optional[...] / Union[...] / Annotated[...] / Dict[..., X]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out = []
    for arg in typing.get_args(annotation):
        out.extend(models_in(arg))
    return out


def model_at(root: Type[BaseModel], path: Tuple) -> Optional[Type[BaseModel]]:
    """The model class that validates the mapping found at `path` under `root` (None if unknown)."""
    cls = root
    for part in path:
        if isinstance(part, int) or cls is None:
            continue
        field = cls.model_fields.get(part)
        if field is None:
            field = next((f for f in cls.model_fields.values() if f.alias == part), None)
        if field is None:
            return None
        models = models_in(field.annotation)
        cls = models[0] if models else None
    return cls


def _homes_of(root: Type[BaseModel], key: str) -> List[str]:
    """The dotted sections (below root) whose schema has `key`, for a key put at the wrong level."""
    queue = [((), root)]
    seen, homes = set(), []
    while queue:
        path, cls = queue.pop(0)
        if cls in seen:
            continue
        seen.add(cls)
        if path and issubclass(cls, StrictModel) and key in cls.known_keys():
            homes.append(dotted(path))
        for name, field in cls.model_fields.items():
            for sub in models_in(field.annotation):
                queue.append((path + (name,), sub))
    return homes


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def translate(err: ValidationError, root: Type[BaseModel], prefix: Tuple = ()) -> List[Tuple[Tuple, str]]:
    """pydantic ValidationError -> [(path tuple, message)], with suggestions for unknown keys."""
    problems: List[Tuple[Tuple, str]] = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        kind = e["type"]
        ctx = e.get("ctx") or {}
        if kind == NESTED:
            for sub, msg in ctx["problems"]:
                problems.append((prefix + loc + tuple(sub), msg))
            continue
        value = e.get("input")
        if kind == "extra_forbidden":
            parent = model_at(root, loc[:-1])
            key = str(loc[-1])
            hint = suggest(key, parent.known_keys() if parent and issubclass(parent, StrictModel) else [])
            if not hint.startswith("did you mean"):
                homes = _homes_of(root, key)
                if len(homes) == 1:
                    hint = f"{key!r} is a key of {homes[0]!r}; move it there"
                elif homes:
                    shown = ", ".join(repr(h) for h in homes[:4]) + (", ..." if len(homes) > 4 else "")
                    hint = f"{key!r} belongs inside a section such as {shown}"
            msg = "unknown key" + (f"; {hint}" if hint else "")
        elif kind == "missing":
            msg = "required key is missing"
        elif kind == PLAIN:
            msg = ctx["message"]
        elif kind == "model_type":
            target = model_at(root, loc)
            example = ' such as {"enabled": true}' if target is not None and "enabled" in target.model_fields else ""
            msg = f"must be a JSON object (a mapping of settings){example} (got {_got(value)})"
        elif isinstance(value, str) and value == "auto":
            msg = ("'auto' is a placeholder that the Hugging Face Trainer fills in before the config reaches the "
                   "engine; give a concrete value here")
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            if msg.startswith("Assertion failed, "):
                msg = msg[len("Assertion failed, "):]
            if not isinstance(value, dict) or kind not in ("model_type", "dict_type"):
                msg += f" (got {_got(value)})"
        problems.append((prefix + loc, msg))
    return problems


def validate_sub(model: Type[BaseModel], data: Any, prefix: Tuple = ()):
    """Validate `data` with `model`; on failure raise nested problems (paths relative to the caller's field)."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise nested_error(translate(err, model, prefix)) from None


__all__ = ["StrictModel", "plain_error", "nested_error", "translate", "validate_sub", "model_at", "dotted"]
