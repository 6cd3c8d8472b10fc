"""Dotted overrides ("model.n_layers=2"): a run's fields replaced by section.field, the values typed from CLI text
when they come as text. Shared by experiment files (ablate.setup.variants: variant, grid, branch) and the CLI (--set);
the result is validated like any run (ablate.config).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

from ablate.config import SECTIONS, ConfigError, RunConfig, describe_type, validate


def _parse_value(text: str, tp, where: str):
    """Turn CLI text into a value of the annotated type."""
    origin = typing.get_origin(tp)
    options = typing.get_args(tp) if origin in (typing.Union, types.UnionType) else (tp,)
    if text.lower() == "none" and type(None) in options:
        return None
    for option in options:
        if typing.get_origin(option) is Literal:
            if text in typing.get_args(option):
                return text
        elif option is bool:
            if text.lower() in ("true", "1", "yes", "false", "0", "no"):
                return text.lower() in ("true", "1", "yes")
        elif option is int:
            try:
                return int(text)
            except ValueError:
                pass
        elif option is float:
            try:
                return float(text)
            except ValueError:
                pass
        elif option is str:
            return text
        elif typing.get_origin(option) is list:  # "100,200": a list of ints
            try:
                return [_parse_value(part, typing.get_args(option)[0], where) for part in text.split(",") if part]
            except ConfigError:
                pass
    raise ConfigError(f"{where}: cannot read {text!r}; allowed: {describe_type(tp)}")


def field_types(section_cls) -> dict:
    """A section's fields and their annotations: its dataclass fields only (never its ClassVars)."""
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


def apply_overrides(run: RunConfig, overrides: dict[str, Any], *, from_text: bool = False) -> RunConfig:
    """Return a copy of `run` with dotted fields replaced ("train.max_steps": 20); values may be CLI text."""
    sections = {}
    top = {}
    for key, value in overrides.items():
        parts = key.split(".")
        if len(parts) == 1 and parts[0] in ("experiment", "name"):
            top[parts[0]] = value
            continue
        if parts[:2] == ["model", "options"] and len(parts) == 3:  # one component option: model.options.softcap=30
            option = (
                _parse_value(value, int | float | bool | str, key) if from_text and isinstance(value, str) else value
            )
            options = sections.setdefault("model", {}).setdefault("options", dict(run.model.options))
            options[parts[2]] = option
            continue
        if len(parts) != 2 or parts[0] not in SECTIONS:
            raise ConfigError(
                f"{key}: expected section.field with section one of {sorted(SECTIONS)} (or 'name' / 'experiment', "
                f"or model.options.NAME)"
            )
        section, name = parts
        hints = field_types(SECTIONS[section])
        if name not in hints:
            raise ConfigError(f"{key}: unknown field; allowed: {sorted(hints)}")
        if from_text and isinstance(value, str):
            value = _parse_value(value, hints[name], key)
        sections.setdefault(section, {})[name] = value
    replaced = {s: dataclasses.replace(getattr(run, s), **kv) for s, kv in sections.items()}
    # overriding a grid axis (--set optim.lr=...) moves the run on that axis: its record follows
    axes = {k: sections.get(k.partition(".")[0], {}).get(k.partition(".")[2], v) for k, v in run.axes.items()}
    return validate(dataclasses.replace(run, **top, **replaced, axes=axes))


def parse_set_args(pairs: list[str]) -> dict[str, str]:
    """['model.n_layers=2', ...] -> {'model.n_layers': '2'}"""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected section.field=value, e.g. train.max_steps=20")
        out[key.strip()] = value.strip()
    return out
