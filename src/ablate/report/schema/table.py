"""docs/reports.md's table of every report.json figure, generated from the records: one table per record, in the
order report.json nests them, each field with its type and its one-line description.

    python -m ablate.report.schema.table          # rewrite the table between the markers in docs/reports.md

tests/test_report_schema.py checks the docs hold what this renders.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Union, get_args, get_origin

from ablate.report.schema.record import ConfigValue, Scalar, ScaleValue, is_record, specs
from ablate.report.schema.report import Report

BEGIN, END = "<!-- schema:begin -->", "<!-- schema:end -->"
DOCS = Path(__file__).resolve().parents[4] / "docs" / "reports.md"
NAMES = {str: "string", int: "int", float: "number", bool: "bool", type(None): "null", dict: "object"}


def type_text(tp) -> str:
    """A field's type as JSON reads it: number or null, [Pairwise], {variant: Final}."""
    if tp == Scalar:
        return "scalar"
    if tp == ScaleValue:
        return "scale"
    if tp == ConfigValue:
        return "config value"
    if is_record(tp):
        return tp.__name__
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(type_text(a) for a in args)
    if origin is list:
        return f"[{type_text(args[0])}]"
    if origin is dict:
        return f"{{key: {type_text(args[1])}}}"
    return NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _inside(tp, keys: str | None) -> list[tuple[type, str]]:
    """The records a field's type holds, each with the path suffix that reaches it ([] a list, [variant] a map)."""
    if is_record(tp):
        return [(tp, "")]
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        return [found for a in args for found in _inside(a, keys)]
    if origin is list:
        return [(r, "[]" + s) for r, s in _inside(args[0], keys)]
    if origin is dict and args:
        return [(r, f"[{keys or 'key'}]" + s) for r, s in _inside(args[1], keys)]
    return []


def records(root: type = Report) -> dict[type, list[str]]:
    """Every record under `root`, in the order report.json nests them, with the paths it is found at."""
    found: dict[type, list[str]] = {}

    def walk(cls: type, path: str) -> None:
        first = cls not in found
        found.setdefault(cls, []).append(path)
        for f in specs(cls) if first else ():
            for inner, suffix in _inside(f.type, f.keys):
                walk(inner, f"{path}.{f.name}{suffix}".lstrip("."))

    walk(root, "")
    return found


def _summary(cls: type) -> str:
    return " ".join((cls.__doc__ or "").split())


def _cell(text: str) -> str:
    """A table cell's text: a | escaped (|t| would end the cell)."""
    return text.replace("|", r"\|")


def render() -> str:
    """The tables, as they stand between the markers."""
    out = []
    for cls, paths in records().items():
        where = ", ".join(f"`{p}`" for p in paths) if paths != [""] else "the whole file"
        out += [f"**{cls.__name__}** ({where}): {_summary(cls)}", "", "| key | type | what it is |", "|---|---|---|"]
        for f in specs(cls):
            kind = type_text(f.type) + (" (optional key)" if f.optional else "")
            out.append(f"| `{f.name}` | {kind} | {_cell(f.doc)} |")
        out.append("")
    return "\n".join(out)


def between_markers(text: str) -> str:
    """The docs' text between the markers (without the newlines next to them)."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def write(path: Path = DOCS) -> bool:
    """Rewrite the table in `path`; True when it changed."""
    text = path.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    new = text[:start] + "\n" + render() + "\n" + text[end:]
    path.write_text(new)
    return new != text


if __name__ == "__main__":
    print(f"{DOCS}: {'rewritten' if write() else 'unchanged'}", file=sys.stderr)
