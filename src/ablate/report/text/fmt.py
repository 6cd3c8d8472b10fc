"""What every part of the report's text shares: the Section a renderer lays out, numbers as shown, and names escaped
for markdown. Used by render.py and the sections (sections/), and by `ablate status` through sequential.py: it loads no
numpy, scipy or matplotlib.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field


@dataclass
class Section:
    """Neutral content: titles, paragraphs, tables of plain strings, images; the markdown and HTML writers only
    escape and lay out."""

    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)  # (caption, header, rows)
    images: list[tuple[str, str]] = field(default_factory=list)  # (caption, base64 PNG), HTML only
    after: list[str] = field(default_factory=list)  # paragraphs after the tables
    folded: str | None = None  # the summary line of a section shown folded (HTML <details>), None: open
    bullets: list[str] = field(default_factory=list)


def fmt(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if abs(x) < 1e-12:  # float rounding of an exact zero
        return "0"
    return f"{x:.{digits}g}"


def rung_label(rung, scale_fields: list[str]) -> str:
    """A rung in words: "d_model=64" (the scale fields' last parts), "this size" without a scale axis."""
    if rung is None or not scale_fields:
        return "this size"
    values = rung if isinstance(rung, list) else [rung]
    return ",".join(f"{f.split('.')[-1]}={v}" for f, v in zip(scale_fields, values))


def hp_name(hyperparameter: str) -> str:
    """A swept hyperparameter as the text names it: LR for optim.lr, else the field."""
    return {"optim.lr": "LR"}.get(hyperparameter, hyperparameter)


def fmt_factor(factor: float) -> str:
    """A factor per doubling: 0.52x, 1.00x (two decimals between 0.1 and 10, where drifts' factors lie)."""
    return f"{factor:.2f}x" if 0.1 <= factor < 10 else f"{factor:.3g}x"


def fmt_ratio(ratio: float) -> str:
    """A compute ratio as a fraction: 1/16 (two significant digits), or 2x above 1."""
    return f"1/{1 / ratio:.2g}" if ratio < 1 else f"{ratio:.2g}x"


def fmt_p(p) -> str:
    return "n/a" if p is None else "0 (no spread)" if p == 0 else f"{p:.2g}"


def fmt_ci(ci, digits: int = 4) -> str:
    return "n/a" if not ci else f"[{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def seeds_needed(
    need: int | None, span: list | None, more_than: str, number=str
) -> tuple[str, tuple[str, str] | None] | None:
    """A pair's seeds needed as text, and the range an sd from few seeds leaves where it is one (None: the seed
    spread is unknown); counts past power.MAX_SEEDS read `more_than` MAX_SEEDS."""
    from ablate.report.stats.power import MAX_SEEDS  # numpy and scipy: loaded by then, where a report is made

    if need is None:
        return None

    def n(x):
        return f"{more_than}{MAX_SEEDS}" if x > MAX_SEEDS else number(x)

    return n(need), ((n(span[0]), n(span[1])) if span and None not in span and span[0] != span[1] else None)


def fmt_seconds(s) -> str:
    if s is None:
        return "n/a"
    return f"{s:.1f}s" if s < 120 else f"{s / 60:.1f}min" if s < 7200 else f"{s / 3600:.1f}h"


# What would start markup where markdown is rendered (GitHub, CommonMark), each taken literally after a backslash:
# emphasis, code, GitHub's math and strikethrough, a table cell's end, headings, the backslash itself; _ at a
# word's edge (inside a word, as in acc_per_char, it is text); ]( of a link, & of an entity, < of a tag or
# autolink. Everything else stays as written, so the raw file reads well too ("p < 0.05", val_loss).
_MD_MARKUP = re.compile(r"[\\*`$~|#]|(?<![^\W_])_|_(?![^\W_])|\](?=\()|&(?=#?\w+;)|<(?=[A-Za-z/!?])")


_MD_BLOCK_START = re.compile(r"^(?:[-+](?=\s|$)|>|\d{1,9}(?=[.)](?:\s|$)))")  # a list item or a quote


def md_escape(text: str) -> str:
    """Names are data: shown as written in rendered markdown, never opening markup or breaking a table cell."""
    return _MD_MARKUP.sub(lambda m: "\\" + m.group(), text.replace("\n", " "))


def md_line(text: str) -> str:
    """md_escape for text that begins a line (a paragraph, a bullet's text), where "- x", "1. x" and "> x" would
    start a list or a quote (table cells keep "-0.3" as it is)."""
    return _MD_BLOCK_START.sub(
        lambda m: m.group() + "\\" if m.group()[0].isdigit() else "\\" + m.group(), md_escape(text)
    )
