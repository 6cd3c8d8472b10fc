"""Text shaping every job shares: names sorted as people read them (d32 < d64 < d128), tables of aligned columns,
and the rule a name must meet to be a folder name.

No torch and nothing else of ablate, so any module may import it (config, `ablate status` and `ablate report` among
them).
"""

from __future__ import annotations

import re


def natural_key(text: str) -> list:
    """d32 < d64 < d128, lr=0.001 < lr=0.01: digits compare as numbers. isdecimal, not isdigit: '²' is a digit
    that float() refuses (a variant named x1² would stop `ablate status` and `ablate report`)."""
    return [
        float(part) if part.replace(".", "", 1).isdecimal() else part
        for part in re.split(r"(\d+(?:\.\d+)?)", str(text))
    ]


def aligned(rows: list[list[str]], text_columns: tuple[int, ...] = (0,)) -> str:
    """Rows as columns two spaces apart: text to the left, numbers to the right (`ablate plan`, `ablate
    tokenizer`)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i in text_columns else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    )


# Experiment and variant names are folder names (runs/<experiment>/<variant>/). 200 bytes of a file system's 255
# leave room for the names made from them. A backslash is allowed: POSIX file systems take it (ablate runs on POSIX
# only), and names such as $\alpha$=0.5 carry it.
FOLDER_NAME_MAX_BYTES = 200
# compute_points() names an arm's runs at budgets other than its rung's "<name>~0.5x": the report knows them by it
COMPUTE_POINT_MARK = "~"
FOLDER_NAME_RULE = (
    f"printable characters of any script and the space, except /; not '.', '..' or a name beginning "
    f"with '.'; no space at either end; at most {FOLDER_NAME_MAX_BYTES} bytes in UTF-8"
)


def folder_name_problem(name: str) -> str | None:
    """What keeps `name` from being a folder name that shows as written everywhere, or None."""
    shown = repr(name) if len(name) <= 80 else f"{name[:40]!r}... ({len(name)} characters)"
    bad = sorted({c for c in name if c == "/" or not c.isprintable()})  # control, format and non-ASCII spaces
    size = len(name.encode("utf-8", "surrogatepass"))
    if not name:
        return "'' is empty"
    if bad:
        return f"{shown} holds {', '.join(repr(c) for c in bad)}"
    if name.startswith("."):
        return f"{shown} begins with '.' ('.' and '..' name folders themselves, '.x' is hidden)"
    if name != name.strip():
        return f"{shown} begins or ends with a space"
    if size > FOLDER_NAME_MAX_BYTES:
        return f"{shown} is {size} bytes in UTF-8"
    return None
