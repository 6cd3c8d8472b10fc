"""The records' machinery: each part of report.json a frozen dataclass (`Record`), read from its JSON-ready dict
(`from_json`) and written back (`to_json`) by its fields' types, keys in field order.

- A field's type says how its value is read: a Record, a list or a map (dict[str, ...]) of them, `X | None`; any
  other value (numbers, text, lists and maps of them) is kept as it is. A key the record does not declare, or one it
  needs and the dict lacks, raises SchemaError naming the key, the record and where it was met: a figure the schema
  lacks cannot be dropped silently.
- `figure(doc)` declares a field with its one-line description (docs/reports.md's table is generated from them);
  `figure(doc, optional=True)` a key that only some reports hold: ABSENT where left out (not null), and to_json
  leaves it out again.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any, Union, get_args, get_origin, get_type_hints

Scalar = str | int | float | bool | None  # a value as a config or an axis holds it
ScaleValue = Scalar | list[Scalar]  # a scale group's value: one field's value, the list for several (runs.scale_value)
ConfigValue = Scalar | list  # a config.json field's value, as written there (a list field's list)


class SchemaError(ValueError):
    """A dict that does not fit its record, with where it was met (`path`, from report.json's top)."""

    def __init__(self, message: str, path: tuple[str, ...] = ()):
        self.message, self.path = message, path
        super().__init__(f"report.json {''.join(path).lstrip('.') or '(top)'}: {message}")

    def within(self, part: str) -> SchemaError:
        return SchemaError(self.message, (part, *self.path))


class Absent:
    """The value of a key the output leaves out (not null): a field only some reports hold."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT = Absent()


def figure(doc: str, *, optional: bool = False, keys: str | None = None) -> Any:
    """A record's field and its one-line description. optional: a key only some reports hold (ABSENT where left
    out); keys: what a map's keys are (variant, run, ...), as the docs' table names its path."""
    metadata = {"doc": doc, "keys": keys}
    if optional:
        return dataclasses.field(default=ABSENT, metadata=metadata)
    return dataclasses.field(metadata=metadata)


def is_record(tp) -> bool:
    return get_origin(tp) is None and isinstance(tp, type) and issubclass(tp, Record)


Codec = tuple[Callable[[Any], Any], Callable[[Any], Any]]


def _each(decode: Callable, value) -> list:
    if not isinstance(value, (list, tuple)):
        raise SchemaError(f"expected a list, got {type(value).__name__}")
    out = []
    for i, x in enumerate(value):
        try:
            out.append(decode(x))
        except SchemaError as exc:
            raise exc.within(f"[{i}]") from None
    return out


def _map(decode: Callable, value) -> dict:
    if not isinstance(value, dict):
        raise SchemaError(f"expected an object, got {type(value).__name__}")
    out = {}
    for k, x in value.items():
        try:
            out[k] = decode(x)
        except SchemaError as exc:
            raise exc.within(f"[{k!r}]") from None
    return out


def codec(tp) -> Codec | None:
    """(decode, encode) of a field's type; None where the value is kept as it is (no record inside)."""
    if is_record(tp):
        return tp.from_json, tp.to_json
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a not in (type(None), Absent)]
        found = [c for a in inner if (c := codec(a)) is not None]
        if not found:
            return None
        if len(inner) != 1:
            raise TypeError(f"{tp}: a record may be optional (| None) but not one of several types")
        decode, encode = found[0]
        return (lambda v: None if v is None else decode(v)), (lambda v: None if v is None else encode(v))
    if origin is list and (c := codec(args[0])) is not None:
        decode, encode = c
        return (lambda v: _each(decode, v)), (lambda v: [encode(x) for x in v])
    if origin is dict and (c := codec(args[1])) is not None:
        decode, encode = c
        return (lambda v: _map(decode, v)), (lambda v: {k: encode(x) for k, x in v.items()})
    return None


@dataclasses.dataclass(frozen=True)
class Spec:
    """One field as from_json and to_json use it."""

    name: str
    type: Any
    codec: Codec | None
    optional: bool
    doc: str
    keys: str | None


@functools.cache
def specs(cls) -> tuple[Spec, ...]:
    hints = get_type_hints(cls)
    return tuple(
        Spec(f.name, hints[f.name], codec(hints[f.name]), f.default is ABSENT, f.metadata["doc"], f.metadata["keys"])
        for f in dataclasses.fields(cls)
    )


record = dataclasses.dataclass(frozen=True, kw_only=True)


class Record:
    """A part of report.json. Subclasses are `@record` dataclasses whose fields are all `figure(...)`."""

    @classmethod
    def from_json(cls, d: dict):
        if not isinstance(d, dict):
            raise SchemaError(f"{cls.__name__}: expected an object, got {type(d).__name__}")
        fields = specs(cls)
        known = [f.name for f in fields]
        unknown = sorted(set(d) - set(known), key=list(d).index)
        if unknown:
            raise SchemaError(
                f"{cls.__name__} has no field {unknown[0]!r} (it holds: {', '.join(known)}); a new figure is declared "
                f"in ablate/report/schema/ with its description"
            )
        missing = [f.name for f in fields if not f.optional and f.name not in d]
        if missing:
            raise SchemaError(f"{cls.__name__}: missing key {missing[0]!r}")
        values = {}
        for f in (f for f in fields if f.name in d):
            try:
                values[f.name] = d[f.name] if f.codec is None else f.codec[0](d[f.name])
            except SchemaError as exc:
                raise exc.within(f".{f.name}") from None
        return cls(**values)

    def to_json(self) -> dict:
        out = {}
        for f in specs(type(self)):
            value = getattr(self, f.name)
            if value is not ABSENT:
                out[f.name] = value if f.codec is None else f.codec[1](value)
        order = self.key_order()
        return out if order is None else {k: out[k] for k in order if k in out}

    def key_order(self) -> tuple[str, ...] | None:
        """The keys' order where today's output orders them by their values (None: field order)."""
        return None
