"""report["multipliers"] -> the headline's compute sentence, the "Compute multipliers" section and its two plots
(the baseline's loss-vs-FLOPs fit per rung with the matched-loss arrows; M against compute with the line M = 1).
Every number shown is read from the record (schema.Multipliers), none recomputed; a multiplier that is not
identifiable shows its reason.
"""

from __future__ import annotations

import dataclasses

from ablate.report.schema import ABSENT, Headline, MultiplierRow, Multipliers, Report
from ablate.report.schema.multipliers import Trend
from ablate.report.text.fmt import Section, fmt, fmt_ci, rung_label


def _times(x) -> str:
    return f"{x:.2f}x" if x is not None else "n/a"


def _interval(ci) -> str:
    return "no interval" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def row_words(row: MultiplierRow, scale_fields: list[str], first: bool) -> str:
    """One rung's multiplier in words: the number and its interval, or why there is none."""
    at = rung_label(row.rung, scale_fields)
    if row.multiplier is None:
        reason = row.note.split(":")[0] if row.extrapolated else f"no number ({row.note})"
        return f"{reason} at {at}"
    compute = " compute" if first else ""
    return f"{_times(row.multiplier)}{compute} {_interval(row.interval)} at {at}"


def trend_words(trend: Trend, rungs: int) -> str:
    if rungs < 2:
        return "one rung: no trend across scale"
    if trend.rungs < 2:
        return f"no trend: a multiplier with its interval at {trend.rungs} of {rungs} rungs"
    change = trend.slope if trend.slope is not None else trend.ratio - 1
    way = "shrinking" if change < 0 else "growing"
    if not trend.established:
        return f"{way} with scale not established"
    if trend.slope is not None:
        return f"{way} with scale (slope {trend.slope:.3g} {_interval(trend.interval)} per unit log compute)"
    return f"{way} with scale (ratio {trend.ratio:.3g} {_interval(trend.interval)})"


def sentence(section: Multipliers, scale_fields: list[str]) -> str:
    """The headline's words: "muon: 1.31x compute [1.12, 1.52] at d_model=64, ...; shrinking with scale not
    established", per variant, or how to ask for multipliers."""
    if section.baseline is None:
        return section.note
    rungs = len(section.rungs)
    parts = []
    for variant, trend in section.trends.items():
        rows = [r for r in section.rows if r.variant == variant and r.kind == "data"]
        said = ", ".join(row_words(r, scale_fields, i == 0) for i, r in enumerate(rows))
        parts.append(f"{variant}: {said}; {trend_words(trend, rungs)}")
    level = f"{section.level:.0%}"
    if not parts:
        return f"Compute multipliers against {section.baseline}: no variant has compute points beside it"
    return f"Compute multipliers against {section.baseline} ({level} intervals, data at fixed size): " + ". ".join(
        parts
    )


def with_headline(headline: Headline, section: Multipliers, scale_fields: list[str]) -> Headline:
    """The headline with its compute sentence after the decisions (never part of a decision)."""
    words = sentence(section, scale_fields)
    return dataclasses.replace(headline, compute=words, text=f"{headline.text} {words}.")


def _budgets(row: MultiplierRow) -> str:
    """M at the arm's other budgets, each with its ratio to this row's M and the ratio's interval (budget_ratios):
    a change of M with the budget is read only where that interval excludes 1."""
    others = [b for b in row.by_budget if abs(b.flops / row.flops - 1) > 1e-3]
    ratios = {round(r.flops, -3): r for r in row.budget_ratios}
    said = []
    for b in others:
        value = _times(b.multiplier) if b.multiplier is not None else b.note.split(":")[0]
        if (r := ratios.get(round(b.flops, -3))) is not None and r.interval is not None:
            verdict = "a change" if r.established else "no change established"
            value += f" (ratio {r.ratio:.2f} {_interval(r.interval)}: {verdict})"
        said.append(f"{fmt(b.flops, 3)}: {value}")
    return "; ".join(said) or "none"


def _table(section: Multipliers, scale_fields: list[str]) -> tuple[str, list[str], list[list[str]]]:
    header = ["variant", "rung", "params", "FLOPs", "val loss", "M", f"{section.level:.0%} interval", "kind"]
    header += ["wall-clock M (this machine)", "seeds", "M at its other budgets", "note"]
    rows = []
    for r in section.rows:
        shown = _times(r.multiplier) if r.multiplier is not None else r.note.split(":")[0]
        rows.append(
            [
                r.variant,
                rung_label(r.rung, scale_fields),
                fmt(r.params),
                fmt(r.flops, 3),
                fmt(r.loss),
                shown,
                fmt_ci(r.interval, 3),
                r.kind
                + (
                    f" (envelope at {rung_label(r.frontier_rung, scale_fields)})"
                    if r.frontier_rung not in (None, ABSENT)
                    else ""
                ),
                _times(r.wall_clock_multiplier) if r.wall_clock_multiplier is not None else "n/a",
                str(r.seeds),
                _budgets(r),
                r.note,
            ]
        )
    caption = f"Compute multipliers against {section.baseline}, at each variant's main budget"
    return caption, header, rows


def _trend_table(section: Multipliers) -> tuple[str, list[str], list[list[str]]]:
    rows = []
    for variant, t in section.trends.items():
        figure = "n/a"
        if t.slope is not None:
            figure = f"slope {fmt(t.slope, 3)}"
        elif t.ratio is not None:
            figure = f"ratio {_times(t.ratio)}"
        rows.append([variant, str(t.rungs), figure, fmt_ci(t.interval, 3), fmt(t.established), t.note])
    header = ["variant", "rungs", "trend", f"{section.level:.0%} interval", "established", "how"]
    return "Trend across scale (of the data multiplier)", header, rows


def _method(section: Multipliers) -> str:
    return (
        f"M = C_base(L_variant) / C_variant: the compute the baseline ({section.baseline}, named by "
        f"{section.baseline_from or '--baseline'}) needs to reach the "
        f"variant's mean validation loss, from its curve L(C) = E + A C^-alpha through its compute points (annealed "
        f"ends at several budgets, FLOPs from each model's own count), over the compute the variant used. M > 1: "
        f"the variant is worth more compute than it used. {section.floor.text}. Intervals: "
        f"{section.level:.0%} delta-method t intervals on log M over seeds (the unit of replication: a seed's "
        f"compute points and the variant's run of that seed taken together), the fit's own uncertainty included. "
        f"Each rung's fit is tested for lack of fit (its residuals against the seeds' spread); where it fails, or E "
        f"sits at the edge of its search (a curvature warning), M is read from a quadratic in log compute through 3 "
        f"of the baseline's points, without E (the row says so). A variant for which the baseline would need more "
        f"compute than its largest budget (or less than its smallest) gets a bound, not a number. M at an arm's other "
        f"budgets comes with the ratio to this budget's M and its interval; a change with the budget is read only "
        f"where that interval excludes 1. The compute points stay out of the comparisons above: those see each arm "
        f"once, at its main budget."
    )


def section(report: Report, with_images: bool) -> Section | None:
    found = report.multipliers
    if found is None:
        return None
    scale = report.options.get("scale") or []
    if found.baseline is None:
        return Section("Compute multipliers", [found.note])
    sec = Section("Compute multipliers", [report.headline.compute or sentence(found, scale), _method(found)])
    sec.tables.append(_table(found, scale))
    sec.tables.append(_trend_table(found))
    if found.projections:
        rows = [
            [v, fmt(p.target_flops, 3), _times(p.multiplier), fmt_ci(p.interval, 3), p.note]
            for v, p in found.projections.items()
        ]
        header = ["variant", "target FLOPs", "M (extrapolated)", "interval", "note"]
        sec.tables.append(("Projection along the trend: an extrapolation, not a measurement", header, rows))
    for name, boot in found.bootstrap.items():
        sec.bullets.append(f"seed bootstrap check, {name}: {fmt_ci(boot.interval, 3)} {boot.note}".rstrip())
    for rung in found.rungs:
        if rung.baseline.note:
            sec.bullets.append(f"{rung_label(rung.rung, scale)}: {rung.baseline.note}")
    sec.bullets += [f"compute point left out: {why}" for why in found.left_out] + found.notes
    if with_images:
        from ablate.report.sections.multipliers import figures  # matplotlib: only where images are drawn

        for caption, image in figures.all_figures(found, scale):
            if image:
                sec.images.append((caption, image))
    return sec
