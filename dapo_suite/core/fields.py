"""Typing a user's value (`--set key=value`, a YAML preset or config file) against a dataclass field's type
hint, and the one config loader of every stage (`load_config`: YAML file, then overrides, then validation).

Driven by the hints alone, so a field added to a config is covered without a line here: `lr: float` takes
`3e-5` or `1` and refuses `abc` ("lr takes a float"), `dynamic_sampling: bool` takes true/false (yes/no,
on/off, 1/0) and refuses `maybe`, `clip_c: float | None` also takes null, `model: str` takes any text as
written, `Literal["a", "b"]` takes one of its values, `list[str]` a YAML list or a comma-separated string.
Ranges are the dataclass's own business (`__post_init__`, with `within` for intervals written "[0, 1)").
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dapo_suite.core.errors import UserError
from dapo_suite.core.provenance import PROVENANCE_KEYS

Config = TypeVar("Config")

_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}
_NULL = {"null", "none", "~", ""}


def field_types(cls: type) -> dict[str, Any]:
    """{field name: resolved type hint} of a dataclass."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def typed_value(cls: type, key: str, value: Any, where: str = "--set") -> Any:
    """`value` (a raw string from the command line, or what YAML read) as the type of `cls.key`.

    Raises UserError naming `where`, the key, the type it takes and the value given."""
    hint = field_types(cls)[key]
    try:
        return _coerce(hint, value)
    except (TypeError, ValueError):
        raise UserError(f"{where} {key}={value}: {key} takes {_describe(hint)}") from None


def read_config_file(cls: type, path: str | Path, stage: str, section: str | None = None) -> dict[str, Any]:
    """The fields a YAML (or JSON) file sets for the config dataclass `cls`, typed against their hints; read
    under a top-level `section:` key when the file has one. A run's provenance keys are skipped (a saved
    config reads back as input); any other key that is not a field is refused, naming the file and the valid
    keys."""
    values = yaml.safe_load(Path(path).read_text()) or {}
    if section and isinstance(values.get(section), dict):
        values = values[section]
    values = {key: value for key, value in values.items() if key not in PROVENANCE_KEYS}
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserError(f"Unknown {stage} setting(s) {unknown} in {path}; valid: {sorted(known)}.")
    return {key: typed_value(cls, key, value, where=f"{path}:") for key, value in values.items()}


def load_config(
    cls: type[Config],
    path: str | Path | None,
    overrides: dict[str, Any],
    stage: str,
    section: str | None = None,
) -> Config:
    """The one config loader of every stage: the dataclass defaults, then the file's values
    (`read_config_file`), then `overrides` (the flags given), then validation by the dataclass's own
    `__post_init__`."""
    values = read_config_file(cls, path, stage, section) if path else {}
    return cls(**{**values, **overrides})


def within(value: float, interval: str) -> bool:
    """value in an interval written "[a, b)", "(a, inf)" ...; NaN is in none."""
    low, high = (float(part) for part in interval[1:-1].split(","))
    above = value >= low if interval[0] == "[" else value > low
    below = value <= high if interval[-1] == "]" else value < high
    return above and below


def _coerce(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if _is_null(value) and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(option, value)
            except (TypeError, ValueError):
                continue
        raise ValueError(value)
    if origin is typing.Literal:
        if value in args or str(value) in map(str, args):
            return next(a for a in args if a == value or str(a) == str(value))
        raise ValueError(value)
    if origin is list:
        items = value if isinstance(value, list) else _parse(value) if isinstance(value, str) else value
        if isinstance(items, str):
            items = [part.strip() for part in items.split(",") if part.strip()]
        if not isinstance(items, list):
            raise TypeError(value)
        return [_coerce(args[0], item) if args else item for item in items]
    if hint is bool:
        text = str(value).strip().lower()
        if isinstance(value, bool):
            return value
        if text in _TRUE | _FALSE and not isinstance(value, float):
            return text in _TRUE
        raise ValueError(value)
    if hint is int:
        if isinstance(value, bool):
            raise TypeError(value)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            number = float(value.strip().replace("_", ""))
            if number.is_integer():
                return int(number)
        raise ValueError(value)
    if hint is float:
        if isinstance(value, bool):
            raise TypeError(value)
        return float(value.strip()) if isinstance(value, str) else float(value)
    if hint is str:
        if isinstance(value, (dict, list)):
            raise TypeError(value)
        return str(value)
    return _parse(value) if isinstance(value, str) else value


def _parse(text: str) -> Any:
    return yaml.safe_load(text)


def _is_null(value: Any) -> bool:
    return value is None or isinstance(value, str) and value.strip().lower() in _NULL


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" (or null)" if type(None) in args else "")
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin is list:
        return "a list (a, b, c or [a, b, c])"
    names = {bool: "true/false", int: "an integer", float: "a float", str: "a string"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))
