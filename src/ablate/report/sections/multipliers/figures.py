"""The compute multipliers' plots, drawn from report["multipliers"] (its record) only, as base64 PNGs (text/plots.py's
png)."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from ablate.report.schema import Multipliers
from ablate.report.schema.multipliers import Rung
from ablate.report.text.fmt import rung_label
from ablate.report.text.plots import png

_BASE_COLOR = "#555555"


def _colors(section: Multipliers) -> dict[str, str]:
    """One color per variant in both plots (the baseline grey)."""
    variants = sorted({r.variant for r in section.rows} | {p.method for p in section.points})
    others = [v for v in variants if v != section.baseline]
    return {section.baseline: _BASE_COLOR} | {v: f"C{i}" for i, v in enumerate(others)}


def _log_x(ax) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks run into each other over a short span


def loss_vs_flops_png(section: Multipliers, rung_entry: Rung, scale_fields: list[str]) -> str | None:
    """One rung: the baseline's seeds at each budget, its fitted curve and band; each variant's seeds as dots and,
    at its main budget, an arrow from its compute to the baseline's compute at the same loss (M times as far)."""
    rung = rung_entry.rung
    points = [p for p in section.points if p.rung == rung and p.counts]
    if not points:
        return None
    fig = Figure(figsize=(5.6, 3.8))
    ax = fig.add_subplot()
    base = section.baseline
    curve = rung_entry.baseline
    if curve.fit is not None:
        band = curve.band
        ax.plot(band.flops, band.loss, color=_BASE_COLOR, linewidth=1.2, label=f"{base}: fit")
        if band.low is not None:
            ax.fill_between(band.flops, band.low, band.high, color=_BASE_COLOR, alpha=0.2, linewidth=0)
    methods = [base] + sorted({p.method for p in points} - {base})
    colors = _colors(section)
    for method in methods:
        mine = [p for p in points if p.method == method]
        if mine:
            ax.scatter([p.flops for p in mine], [p.loss for p in mine], s=12, color=colors[method], label=method)
    for row in section.rows:
        if row.rung != rung or row.kind != "data" or row.multiplier is None:
            continue
        start, end = row.flops, row.flops * row.multiplier
        ax.annotate(
            "",
            xy=(end, row.loss),
            xytext=(start, row.loss),
            arrowprops={"arrowstyle": "->", "color": colors.get(row.variant, "black"), "linewidth": 1.2},
        )
        ax.text(end, row.loss, f" {row.multiplier:.2f}x", fontsize=7, va="center")
    _log_x(ax)
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("validation loss")
    title = f"{rung_label(rung, scale_fields)}: loss vs compute, {base}'s fit and band"
    if any(r.rung == rung and r.read_from == "local quadratic" for r in section.rows):
        title += "\n(the fit fails here: M read from a local quadratic through the points)"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return png(fig)


def multiplier_png(section: Multipliers, scale_fields: list[str]) -> str | None:
    """Each variant's multiplier against its compute, with its interval as error bars, and the line M = 1."""
    rows = [r for r in section.rows if r.multiplier is not None]
    if not rows:
        return None
    fig = Figure(figsize=(5.2, 3.4))
    ax = fig.add_subplot()
    colors = _colors(section)
    for variant in sorted({r.variant for r in rows}):
        for kind, marker in (("data", "o"), ("frontier", "s")):
            mine = [r for r in rows if r.variant == variant and r.kind == kind]
            if not mine:
                continue
            x = [r.flops for r in mine]
            y = [r.multiplier for r in mine]
            err = [
                [r.multiplier - r.interval[0] if r.interval else 0 for r in mine],
                [r.interval[1] - r.multiplier if r.interval else 0 for r in mine],
            ]
            label = variant if kind == "data" else f"{variant} (frontier)"
            ax.errorbar(x, y, yerr=err, marker=marker, capsize=3, color=colors[variant], label=label, linestyle="-")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    _log_x(ax)
    ax.set_xlabel("the variant's training FLOPs (one point a rung)")
    ax.set_ylabel(f"compute multiplier vs {section.baseline}")
    ax.set_title(f"M with {section.level:.0%} intervals; M = 1: no effect", fontsize=9)
    ax.legend(fontsize=7)
    return png(fig)


def all_figures(section: Multipliers, scale_fields: list[str]) -> list[tuple[str, str | None]]:
    out = [
        (
            f"{rung_label(r.rung, scale_fields)}: validation loss against training FLOPs; the baseline's fit with "
            f"its {section.level:.0%} band, every seed a dot, arrows from each variant's compute to the "
            f"baseline's compute at the same loss",
            loss_vs_flops_png(section, r, scale_fields),
        )
        for r in section.rungs
    ]
    out.append(
        (
            "Compute multiplier against the variant's compute, with intervals; the dashed line is M = 1",
            multiplier_png(section, scale_fields),
        )
    )
    return out
