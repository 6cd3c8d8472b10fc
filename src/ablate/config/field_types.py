"""An annotation checked against a value and put in words: what makes every config error name what a field takes."""

from __future__ import annotations

import types
import typing
from typing import Literal


def describe_type(tp) -> str:
    """An annotation in words, for error messages: "one of 'cf', 'mcf'", "int or None"."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {describe_type(typing.get_args(tp)[0])}"
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        return f"a dict of {describe_type(key_tp)} -> {describe_type(value_tp)}"
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def matches_type(value, tp) -> bool:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(matches_type(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(matches_type(v, typing.get_args(tp)[0]) for v in value)
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        return isinstance(value, dict) and all(
            matches_type(k, key_tp) and matches_type(v, value_tp) for k, v in value.items()
        )
    return isinstance(value, tp)
