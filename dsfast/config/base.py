"""Strict pydantic base model and the translation of pydantic errors into DsConfigError lines.

Every section of the schema derives from StrictModel: unknown keys are rejected (extra="forbid"), and the
translator turns that into "fp16.loss_scale_windw: unknown key; did you mean 'loss_scale_window'?".
"""
from __future__ import annotations

import typing
from typing import Any, Dict, List, Optional, Tuple, Type

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from .errors import dotted, suggest

NESTED = "dsfast_nested"   # error type carrying already-translated problems of a sub-schema
PLAIN = "dsfast"           # error type whose message is final


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True,
                              validate_assignment=False, arbitrary_types_allowed=False)

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


def _models_in(annotation) -> List[Type[BaseModel]]:
    """The BaseModel classes reachable inside Optional[...] / Union[...] / Annotated[...] / Dict[..., X]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out = []
    for arg in typing.get_args(annotation):
        out.extend(_models_in(arg))
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
        models = _models_in(field.annotation)
        cls = models[0] if models else None
    return cls


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
            hint = suggest(str(loc[-1]), parent.known_keys() if parent and issubclass(parent, StrictModel) else [])
            msg = "unknown key" + (f"; {hint}" if hint else "")
        elif kind == "missing":
            msg = "required key is missing"
        elif kind == PLAIN:
            msg = ctx["message"]
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
