"""report.json's `sequential` (an adaptive study, section.py's record) -> a section of report.md and report.html:
the contrasts as a table, the method and its guarantee, the compute against a fixed design, how the study stopped,
and a flag where its rule changed after results were seen."""

from __future__ import annotations

from ablate.report.schema.sequential import Contrast, Rule, Sequential
from ablate.report.sections.sequential.decide import CLOSED
from ablate.report.sections.sequential.words import futility_text
from ablate.report.text.fmt import Section, fmt, fmt_seconds


def _decision(c: Contrast, rule: Rule) -> str:
    if c.decision in ("a", "b"):
        return f"{c.a if c.decision == 'a' else c.b} better"
    if c.decision in CLOSED:
        return futility_text(c.chance, c.fixed_power, rule.futility, rule.max_seeds)
    return c.decision


def _interval(c: Contrast) -> str:
    if c.interval is None:
        return "none (fewer than 2 pairs, or no spread)"
    lo, hi = c.interval
    return "unbounded" if lo is None or hi is None else f"[{fmt(lo)}, {fmt(hi)}]"


def section(seq: Sequential | None) -> Section | None:
    """The adaptive study's section; None for a fixed design."""
    if seq is None:
        return None
    return Section("Adaptive study", _paragraphs(seq), [_contrasts_table(seq)])


def _paragraphs(seq: Sequential) -> list[str]:
    """The rule and how the study stopped, the method and its guarantee, the compute; a flag where the rule changed
    after results were seen."""
    rule, compute = seq.rule, seq.compute
    margins = ", ".join(f"{m} +-{v:g}" for m, v in rule.margins.items()) or "none (no contrast can end equivalent)"
    paragraphs = [
        f"Decision rule, recorded before round 1: metrics {', '.join(rule.metrics)}; margins {margins}; alpha "
        f"{rule.alpha:g}; at most {rule.max_seeds} seeds per variant"
        + (f"; budget {rule.budget}" if rule.budget else "")
        + f". {seq.rounds} round(s); "
        + {
            "decided": "stopped: every contrast decided or closed for futility",
            "max_seeds": "stopped at max seeds",
            "budget": "stopped by the budget",
        }.get(seq.stopped, "not stopped (rounds may follow)")
        + ".",
        f"Method: {seq.method}, "
        + _levels(seq)
        + ". "
        + _DESIGN_TEXT[seq.design].format(level=f"{1 - seq.alpha:g}")
        + " Equivalent: the interval inside +-margin (checked first); a side better: the interval excludes 0. "
        "Recomputed here from the run folders; the seed-level variance is floored by the items' noise, as in "
        "the fixed-n tests.",
        f"Compute: {fmt(compute.tokens)} training tokens"
        + (f", {fmt_seconds(compute.device_seconds)} of device time" if compute.device_seconds else "")
        + (
            f": {compute.fixed_design_share:.0%} of a fixed design of {compute.fixed_design_seeds} seeds "
            f"per variant ({fmt(compute.fixed_design_tokens)} tokens)"
            if compute.fixed_design_share is not None
            else ""
        )
        + ".",
    ]
    if not seq.rule_changed_after_results:
        return paragraphs
    return [
        *paragraphs,
        "FLAGGED: the decision rule changed after results were seen ("
        + "; ".join(seq.rule_changes)
        + "). The guarantee above assumes a rule fixed before any result; it does not hold for this study.",
    ]


def _contrasts_table(seq: Sequential) -> tuple[str, list[str], list[list[str]]]:
    """The contrasts, one row each: (caption, header, rows)."""
    anytime = seq.design == "anytime"
    rows = [
        [
            c.metric,
            f"{c.a} vs {c.b}",
            _decision(c, seq.rule),
            str(c.seeds),
            "" if c.decided_at is None else str(c.decided_at),
            fmt(c.estimate),
            _interval(c),
            *([] if anytime else [_boundary(c)]),
            "none" if c.margin is None else f"+-{c.margin:g}",
            c.note,
        ]
        for c in seq.contrasts
    ]
    interval = ["anytime interval"] if anytime else ["repeated interval", "boundary |t|"]
    header = ["metric", "contrast", "decision", "paired seeds", "decided at", "a - b", *interval, "margin"]
    return "Contrasts (a - b on the metric's scale)", [*header, "note"], rows


_DESIGN_TEXT = {
    "anytime": "Each interval is a confidence sequence for mean(a - b) over the paired seeds (the running "
    "intersection over the rounds): with probability >= {level} every interval covers its true difference at every "
    "round, whenever the study stopped and however far it was extended, so alpha bounds the chance of any wrong "
    "winner or wrong equivalence.",
    "group_sequential": "Each interval is a repeated confidence interval for mean(a - b) at the boundary of its "
    "look, at its contrast's level (alpha spent over the looks up to max seeds, fixed before round 1; the running "
    "intersection over the rounds). Holm's recycling: each contrast starts at alpha / K, and once r are decided on a "
    "side the others are judged at alpha / (K - r), every look at the boundaries of that level; with probability >= "
    "{level} no contrast without a difference is decided on a side, wherever the study stopped (wrong directions and "
    "wrong equivalences, outside Holm's argument, are measured in simulation: docs/reports.md). Closed for "
    "futility: its estimated chance of being decided by max seeds, if the difference is what it seems, fell below "
    "the futility threshold (conditional power, the remaining seeds' mean and variance both random); that is not a "
    "claim that no design could decide it (the fixed design's power at the difference seen is shown beside it). "
    "Non-binding: the guarantee holds whether or not the rule is followed; its variants get no more seeds for it.",
}


def _levels(seq: Sequential) -> str:
    """'each interval at 0.0167' (Bonferroni, or Holm before anything was decided), or the levels Holm's recycling
    reached ('intervals at 0.0167 to 0.05')."""
    levels = sorted({c.level for c in seq.contrasts if c.level is not None})
    if len(levels) > 1 or (levels and levels[0] > seq.alpha_per_contrast * (1 + 1e-9)):
        return f"intervals at {levels[0]:.3g} to {levels[-1]:.3g} (each contrast's level in report.json)"
    return f"each interval at {seq.alpha_per_contrast:.3g}"


def _boundary(c: Contrast) -> str:
    return "none yet" if c.boundary is None else f"{c.boundary:.3g}"
