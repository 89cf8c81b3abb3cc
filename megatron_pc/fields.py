"""Build a config dataclass from a plain mapping (parsed YAML), checking every key and type.

A leaf module: every component's ``config.py`` may use it (``data/config.py`` parses its list of
validation sets with it) without importing the root :mod:`megatron_pc.config`, which imports them.
Errors name the dotted field and, for an unknown key, the nearest known ones.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from megatron_pc.errors import ConfigError

__all__ = ["from_dict", "to_dict"]

_YAML_BOOL_WORDS = {True: ("on", "yes", "y", "true"), False: ("off", "no", "n", "false")}
"""Words YAML reads as booleans: a choice spelled so (``preset: off``) is the choice, not the boolean."""


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a mapping, checking keys and types; errors name the field."""
    if not isinstance(data, dict):
        raise ConfigError(prefix or cls.__name__, f"expected a mapping of fields, got {_describe(data)}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        shown = key if isinstance(key, str) and key.strip() and key == key.strip() else repr(key)  # '' or ' x' or 3: quoted
        dotted = f"{prefix}.{shown}" if prefix else shown
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(prefix + '.' + c if prefix else c for c in close)}?" if close else ""
            allowed = ", ".join(names)
            raise ConfigError(dotted, f"unknown field{hint} (fields here: {allowed})")
        kwargs[key] = _coerce(value, hints[key], dotted)
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.within(prefix) from None


def to_dict(obj: Any) -> Any:
    """A plain, YAML/JSON-ready copy of a config dataclass."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def _coerce(value: Any, tp: Any, dotted: str) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, dotted)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise ConfigError(dotted, "must not be null")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, dotted)
            except ConfigError as err:
                errors.append(err.rule)
        raise ConfigError(dotted, " or ".join(errors))
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, bool):  # YAML reads an unquoted off / on / no / yes as a boolean
            spelled = [a for a in allowed if isinstance(a, str) and a.lower() in _YAML_BOOL_WORDS[value]]
            value = spelled[0] if len(spelled) == 1 else value
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(dotted, f"must be one of {', '.join(repr(a) for a in allowed)}, got {value!r}{hint}")
        return value
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(dotted, f"must be true or false, got {_describe(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(dotted, f"must be an integer, got {_describe(value)}")
        return value
    if tp is float:
        if isinstance(value, str):
            # YAML 1.1 reads 1e-5 (no dot) as a string; accept what Python reads as a number.
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(dotted, f"must be a number, got {_describe(value)}")
        if not math.isfinite(value):
            raise ConfigError(dotted, f"must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(dotted, f"must be a string, got {_describe(value)}")
        return value
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(dotted, f"must be a list, got {_describe(value)}")
        (item_tp,) = get_args(tp)[:1] or (Any,)
        return [_coerce(v, item_tp, f"{dotted}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(dotted, f"must be a mapping, got {_describe(value)}")
        args = get_args(tp)
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(v, val_tp, f"{dotted}.{k}") for k, v in value.items()}
    raise TypeError(f"config field {dotted} has a type the loader does not handle: {tp!r}")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if value is not None else "null"


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b.c": value}``: the dotted keys of every leaf."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out
