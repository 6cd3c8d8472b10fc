"""Plots for report.html, drawn from report.json's curves only, as base64 PNGs.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend switch), so it runs headless and
leaves a caller's matplotlib state alone. Every plot of the report (these and the sections' figures.py) is drawn
inside as_written(), so names show as they are written.
"""

from __future__ import annotations

import base64
import io
import re
from contextlib import contextmanager

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, LogFormatterSciNotation, MaxNLocator

from ablate.report.schema import Curve, Series


@contextmanager
def as_written():
    """Text drawn inside shows as written: matplotlib would read a pair of $ in a title, legend or tick label as
    math (`$\\alpha$=0.5` drawn as a Greek letter, `$\\lr$=2e-3` a parse error), and names may hold any printable
    character. Text objects take the setting when they are made (tick labels at savefig), so figures are built and
    saved inside; the caller's settings come back on exit."""
    with matplotlib.rc_context({"text.parse_math": False}):
        yield


class _PlainLogFormatter(LogFormatterSciNotation):
    """A log axis's labels (10⁻³, 2×10⁻³) in plain text: matplotlib's default spells them in mathtext, which would
    show as typed inside as_written()."""

    def __call__(self, x, pos=None) -> str:
        text = super().__call__(x, pos)  # '$\\mathdefault{2\\times10^{-3}}$', or '' for an unlabelled tick
        text = re.sub(r"^\$\\mathdefault\{(.*)\}\$$", r"\1", text).replace(r"\times", "×")
        return re.sub(r"\^\{([^}]*)\}", lambda m: m.group(1).translate(_SUPERSCRIPT), text)


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def png(fig: Figure) -> str:
    """The figure as a base64 PNG (for an <img> data URL)."""
    for axis in (axis for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)):
        for get, put in (
            (axis.get_major_formatter, axis.set_major_formatter),
            (axis.get_minor_formatter, axis.set_minor_formatter),
        ):
            if type(get()) is LogFormatterSciNotation:  # a log scale's own labels (a plot's choice stays)
                put(_PlainLogFormatter(axis.get_transform().base, labelOnlyBase=get().labelOnlyBase))
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def chance_on_axis(curves: dict[str, Curve], chance: float | None) -> bool:
    """Whether the chance line is drawn: only when it lies within one data span of the curves. Further away (val
    loss starts near ln(vocab) and falls far below it) it would flatten every difference between the curves."""
    values = [v for c in curves.values() for v in c.min + c.max]
    if chance is None or not values:
        return False
    span = max(values) - min(values)
    return min(values) - span <= chance <= max(values) + span


def _axes_style(ax, legend: list[tuple]) -> None:
    """Token counts as 1.2M rather than 1.2e6, a few ticks, and a legend beside the plot when it is long. The
    legend's (line, label) pairs are given, not collected: matplotlib leaves out labels that begin with '_', and a
    variant may be named so."""
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.xaxis.set_major_locator(MaxNLocator(6))
    ax.tick_params(labelsize=8)
    ax.set_xlabel("tokens")
    ax.grid(alpha=0.3)
    lines, labels = zip(*legend)
    if len(legend) > 6:
        ax.legend(lines, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    else:
        ax.legend(lines, labels, fontsize=7)


def curves_png(
    title: str, ylabel: str, curves: dict[str, Curve], chance: float | None = None, compared_tokens: int | None = None
) -> str | None:
    """Mean per variant against tokens, with a band from the lowest to the highest seed; a dashed line where finals
    are compared when that is before some runs' end (equal tokens)."""
    if not any(c.steps for c in curves.values()):
        return None
    fig = Figure(figsize=(5.2, 3.2))
    ax = fig.add_subplot()
    legend = []
    for variant, c in curves.items():
        if not c.steps:
            continue
        (line,) = ax.plot(c.tokens, c.mean, marker="." if len(c.steps) < 30 else None)
        legend.append((line, variant))
        if c.std is not None:
            ax.fill_between(c.tokens, c.min, c.max, color=line.get_color(), alpha=0.2, linewidth=0)
    if chance_on_axis(curves, chance):  # else it would squash the curves (the caption says so)
        legend.append((ax.axhline(chance, color="grey", linestyle=":", linewidth=1), "chance"))
    if compared_tokens is not None:
        legend.append((ax.axvline(compared_tokens, color="black", linestyle="--", linewidth=0.8), "compared here"))
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    _axes_style(ax, legend)
    return png(fig)


def ranking_png(series: list[Series]) -> str | None:
    """Kendall tau of each task's ranking (primary metric) against its final ranking, over training."""
    rows = [(s.task, s.quality.ranking.by_checkpoint) for s in series]
    rows = [(task, [r for r in points if r.tau is not None]) for task, points in rows]
    rows = [(task, points) for task, points in rows if points]
    if not rows:
        return None
    fig = Figure(figsize=(5.2, 3.2))
    ax = fig.add_subplot()
    legend = [
        (ax.plot([r.tokens for r in points], [r.tau for r in points], marker=".")[0], task) for task, points in rows
    ]
    ax.set_ylim(-1.05, 1.05)
    ax.set_title("ranking vs final ranking (Kendall tau)", fontsize=10)
    ax.set_ylabel("tau")
    _axes_style(ax, legend)
    return png(fig)
