"""The evidence under the decisions, one "Final scores" section per scale group (text/render.py places them): what
the scores were compared under, each decision metric's finals per variant and its pairs as tested, then every
metric's final mean per variant. Every number shown is read from the Report record.
"""

from __future__ import annotations

from ablate.report.inputs.runs import sign_of
from ablate.report.schema import Group, Pairwise, Report, Series
from ablate.report.sections.decisions import opening
from ablate.report.text.fmt import Section, fmt, fmt_ci, fmt_p, seeds_needed

Table = tuple[str, list[str], list[list[str]]]  # (caption, header, rows), as Section.tables holds them

_PAIR_COLUMNS = [
    "seeds",
    "test",
    "p (seeds)",
    "p_BH",
    "significant",
    "better",
    "seeds needed",
    "p (items: eval noise only)",
    "note",
]
WIDE = 3  # past this many variants a table turns: a row per variant, or the best against each other variant
MAX_METRICS = 8  # the metric columns the turned "every metric" table shows (report.json holds every one)


def final_scores_section(group: Group, suffix: str, report: Report, largest: bool) -> Section:
    """One scale group's final scores: the notes on how they were compared, a table of finals and one of pairs for
    each decision metric (the primary metric at every scale), and every metric's final mean per variant. largest:
    the group decisions are read at."""
    o = report.options
    decisions = {tuple(k) for k in report.inference.metrics} if largest else set()
    level = opening.ci_level(o)
    shown = [s for s in group.series if s.primary or (s.task, s.metric) in decisions]
    every, cut = _every_metric_table(group, o["alpha"])
    return Section(
        f"Final scores{suffix}",
        _compared_under(group, report) + cut,
        [table for s in shown for table in _series_tables(s, level)] + [every],
    )


def _compared_under(group: Group, report: Report) -> list[str]:
    """What the finals were compared under, in words: optional stopping, averaged evaluations, run shapes that
    differ, item sets that differ."""
    o, out = report.options, []
    if report.sequential:  # seeds were added where decisions were open: the fixed-n p's looked every round
        out.append(f"Adaptive study: p (seeds) and p_BH here are {report.inference.optional_stopping_note}.")
    if o.get("average_last", opening.DEFAULTS.average_last) > 1:
        out.append(
            f"Averaged: each run's score is the mean of its last {o['average_last']} evaluations up "
            f"to the compared one (each item's mean, where per-item files exist; runs with fewer "
            f"evaluations average what they have: the 'averaged' counts in report.json)."
        )
    for field, values in group.shape_differences.items():
        out.append(
            f"{field} differs between runs ("
            + "; ".join(f"{v}: {', '.join(names)}" for v, names in values.items())
            + "): steps mean different token counts, so finals are compared at equal tokens and "
            "curves are drawn against tokens."
        )
    return out + ["Different item sets: " + m.text + "." for m in group.item_mismatch]


def _series_tables(s: Series, level: str) -> list[Table]:
    """A decision metric's finals (mean, seed sd, interval, seeds, items per variant), then its pairs if any."""
    name = f"{s.task} [{s.metric}, {s.direction} is better]"
    rows = [
        [
            v,
            fmt(f.mean),
            fmt(f.seed_std),
            fmt_ci(f.ci),
            str(len(f.seeds)),
            fmt(f.n_items),
            "best" if v == s.best else "",
        ]
        for v, f in s.final.items()
    ]
    header = ["variant", "mean", "seed sd", f"{level} CI", "seeds", "items", ""]
    finals = (f"{name}, at {s.compared_at.text}", header, rows)
    return [finals, _pairwise_table(s, name, level)] if s.pairwise else [finals]


def _vs(p: Pairwise, leader: str) -> tuple[str, float, list | None]:
    """A pairwise row read from the leader's side: 'leader vs other', diff = leader - other."""
    if p.a == leader:
        return f"{p.a} vs {p.b}", p.diff, p.ci
    return f"{p.b} vs {p.a}", -p.diff, None if not p.ci else [-p.ci[1], -p.ci[0]]


def _pairwise_table(s: Series, name: str, level: str) -> Table:
    """All pairs for up to 3 variants; else each variant against the best one (all pairs stay in report.json)."""
    sign = sign_of(s.direction)
    leader = s.best or max(s.final, key=lambda v: sign * s.final[v].mean)
    wide = len(s.final) > WIDE
    rows = [p for p in s.pairwise if leader in (p.a, p.b)] if wide else s.pairwise
    out = []
    for p in rows:
        pair, diff, ci = _vs(p, leader) if wide else (f"{p.a} vs {p.b}", p.diff, p.ci)
        if wide:
            pair = pair.split(" vs ", 1)[1]  # the caption names the best
        seeds = f"{p.n_seeds} paired" if p.paired else f"{p.n_seeds_a} and {p.n_seeds_b}"
        out.append(
            [
                pair,
                fmt(diff),
                fmt_ci(ci),
                seeds,
                p.test or "n/a",
                fmt_p(p.p_seeds),
                fmt_p(p.p_bh),
                "n/a" if p.significant is None else fmt(p.significant),
                p.better or "tie",
                "" if p.significant else _needed(p),
                fmt_p(p.p_items),
                p.note,
            ]
        )
    columns = [f"{level} CI (the test's)", *_PAIR_COLUMNS]
    if not wide:
        return f"{name}: pairwise", ["pair", "diff", *columns], out
    return (
        f"{name}: the best ({leader}) vs each other variant, diff = {leader} - other; all {len(s.pairwise)} "
        f"pairs are in report.json",
        [f"{leader} vs", "diff", *columns],
        out,
    )


def _needed(p: Pairwise) -> str:
    """Seeds needed, with the range an sd from few seeds leaves: '13 (6-210)'."""
    found = seeds_needed(p.seeds_needed, p.seeds_needed_range, ">", fmt)
    if found is None:
        return "n/a"
    need, span = found
    return need + (f" ({span[0]}-{span[1]})" if span else "")


def _every_metric_table(group: Group, alpha: float) -> tuple[Table, list[str]]:
    """Every metric's final mean per variant, with its best and its significant pairs: a row per metric, or past
    3 variants a row per variant (a column per variant runs off the page). Also the sentence saying the metrics
    were cut to the first 8, where they were."""
    variants, series = group.variants, group.series
    if len(variants) > WIDE:
        return _every_metric_by_variant(variants, series)
    rows = [
        [s.task, s.metric, s.direction]
        + [fmt(s.final[v].mean) if v in s.final else "" for v in variants]
        + [s.best or "tie", ", ".join(_significant(s))]
        for s in series
    ]
    header = ["task", "metric", "better"] + variants + ["best", f"significant (p_BH < {alpha:g})"]
    return ("Every metric: final mean per variant", header, rows), []


def _significant(s: Series) -> list[str]:
    """A series' significant pairs as 'better>worse'; with many variants their count (the pairs table lists them)."""
    found = [f"{p.better}>{p.b if p.better == p.a else p.a}" for p in s.pairwise if p.significant]
    return [f"{len(found)} of {len(s.pairwise)} pairs"] if len(s.final) > WIDE and found else found


def _every_metric_by_variant(variants: list[str], series: list[Series]) -> tuple[Table, list[str]]:
    """The every-metric table turned: a row per variant, a column per metric (the first 8 of them)."""
    header = ["variant"] + [f"{s.task} {s.metric} ({s.direction})" for s in series]
    rows = [
        [v] + [fmt(s.final[v].mean) + (" best" if v == s.best else "") if v in s.final else "" for s in series]
        for v in variants
    ]
    cut = []
    if len(series) > MAX_METRICS:
        rows, header = [row[: MAX_METRICS + 1] for row in rows], header[: MAX_METRICS + 1]
        cut = [f"The first {MAX_METRICS} of {len(series)} metrics per variant; every one is in report.json."]
    return ("Every metric: final mean per variant", header, rows), cut
