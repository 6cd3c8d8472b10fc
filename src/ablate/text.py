"""Text shaping every job shares: names sorted as people read them (d32 < d64 < d128) and tables of aligned columns.

No torch and nothing else of ablate, so any module may import it (`ablate status` and `ablate report` among them).
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
