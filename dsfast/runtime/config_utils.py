"""deepspeed.runtime.config_utils: the base class DeepSpeed-style config sections are written on, and the readers of
a ds_config dict, for programs and plugins that define their own sections the DeepSpeed way (DeepSpeed-MII's
configs, inference plugins) or parse ds_config JSON themselves.

    class MySection(DeepSpeedConfigModel):
        enabled: bool = False
        size: int = Field(8, ge=1)
        old_size: int = Field(8, json_schema_extra={"deprecated": True, "new_param": "size"})
    MySection(size="auto")             # "auto" means the default, as in DeepSpeed
    MySection(old_size=4).size == 4    # a deprecated key still works, with a warning naming its replacement
    MySection(sise=4)                  # pydantic.ValidationError: an unknown key is an error
"""
import collections
import json
import warnings

from pydantic import BaseModel, ConfigDict


class DeepSpeedConfigModel(BaseModel):
    """A config section: unknown keys are errors, values are checked on assignment too, "auto" means the default,
    fields may be given by name or alias, and a field marked deprecated (json_schema_extra={"deprecated": True,
    "new_param": "name", "new_param_fn": fn}) is carried over to its replacement with a warning."""
    model_config = ConfigDict(validate_default=True, validate_assignment=True, use_enum_values=True,
                              populate_by_name=True, extra="forbid", arbitrary_types_allowed=True,
                              protected_namespaces=())

    def __init__(self, strict=False, **data):
        if not strict:   # "auto" is DeepSpeed's "let the program or the engine decide": the field's default here
            data = {k: v for k, v in data.items() if not (isinstance(v, str) and v == "auto")}
        super().__init__(**self._carry_deprecated(data))

    @classmethod
    def _carry_deprecated(cls, data):
        """A deprecated key's value also set on its replacement, with a warning (at construction, as DeepSpeed
        does: not again on each later assignment)."""
        for name, field in cls.model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if not extra.get("deprecated"):
                continue
            key = name if name in data else (field.alias if field.alias in data else None)
            if key is None:
                continue
            new = extra.get("new_param")
            hint = f"; use {new!r} instead" if new else ""
            warnings.warn(f"{cls.__name__}: config key {key!r} is deprecated{hint}", DeprecationWarning,
                          stacklevel=4)
            if new:
                if new not in cls.model_fields:
                    raise ValueError(f"{cls.__name__}.{name}: its new_param {new!r} is not a field of the class")
                if new in data:
                    raise ValueError(f"{cls.__name__}: both {key!r} (deprecated) and {new!r} are set; keep {new!r}")
                fn = extra.get("new_param_fn", lambda value: value)
                data = {**data, new: fn(data[key])}
        return data


class DeepSpeedConfigObject:
    """A plain config holder whose repr is its fields as indented JSON."""

    def repr(self):
        return self.__dict__

    def __repr__(self):
        return json.dumps(self.__dict__, sort_keys=True, indent=4, default=repr)


def get_scalar_param(param_dict, param_name, param_default_value):
    """param_dict[param_name], or the default when it is absent."""
    return param_dict.get(param_name, param_default_value)


get_list_param = get_dict_param = get_scalar_param   # DeepSpeed's three names for the same read


def dict_raise_error_on_duplicate_keys(ordered_pairs):
    """json.load(..., object_pairs_hook=this): a key given twice in one JSON object is an error naming it."""
    counts = collections.Counter(key for key, _ in ordered_pairs)
    duplicates = sorted(key for key, n in counts.items() if n > 1)
    if duplicates:
        raise ValueError(f"duplicate key(s) in a config object: {', '.join(map(repr, duplicates))}")
    return dict(ordered_pairs)


class pp_int(int):   # noqa: N801  (DeepSpeed's name)
    """An int that prints with thousands separators (or a custom text) in config dumps."""

    def __new__(cls, val, custom_print_str=None):
        inst = super().__new__(cls, val)
        inst.custom_print_str = custom_print_str
        return inst

    def __repr__(self):
        return self.custom_print_str if self.custom_print_str else f"{int(self):,}"


__all__ = ["DeepSpeedConfigModel", "DeepSpeedConfigObject", "get_scalar_param", "get_list_param", "get_dict_param",
           "dict_raise_error_on_duplicate_keys", "pp_int"]
