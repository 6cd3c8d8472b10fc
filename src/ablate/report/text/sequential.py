"""report.json's `sequential` (an adaptive study, report/sequential.py) -> a section of report.md and report.html:
the contrasts as a table, the method and its guarantee, the compute against a fixed design, how the study stopped,
and a flag where its rule changed after results were seen."""

from __future__ import annotations

import math

from ablate.report.text.fmt import Section, fmt, fmt_seconds

_DECISION = {"equivalent": "equivalent", "open": "open"}


def _decision(c: dict) -> str:
    if c["decision"] in ("a", "b"):
        return f"{c[c['decision']]} better"
    return _DECISION.get(c["decision"], c["decision"])


def _interval(c: dict) -> str:
    if c["interval"] is None:
        return "none (fewer than 2 pairs, or no spread)"
    lo, hi = c["interval"]
    return "unbounded" if lo is None or hi is None else f"[{fmt(lo)}, {fmt(hi)}]"


def section(report: dict) -> Section | None:
    """The adaptive study's section; None for a fixed design."""
    seq = report.get("sequential")
    if not seq:
        return None
    rule, compute = seq["rule"], seq["compute"]
    margins = ", ".join(f"{m} +-{v:g}" for m, v in rule["margins"].items()) or "none (no contrast can end equivalent)"
    sec = Section(
        "Adaptive study",
        [
            f"Decision rule, recorded before round 1: metrics {', '.join(rule['metrics'])}; margins {margins}; alpha "
            f"{rule['alpha']:g}; at most {rule['max_seeds']} seeds per variant"
            + (f"; budget {rule['budget']}" if rule["budget"] else "")
            + f". {seq['rounds']} round(s); "
            + {
                "decided": "stopped: every contrast decided",
                "max_seeds": "stopped at max seeds",
                "budget": "stopped by the budget",
            }.get(seq["stopped"], "not stopped (rounds may follow)")
            + ".",
            f"Method: {seq['method']}, each interval at {seq['alpha_per_contrast']:.3g}. Each interval is a "
            "confidence sequence for mean(a - b) over the paired seeds (the running intersection over the rounds): "
            f"with probability >= {1 - seq['alpha']:g} every interval covers its true difference at every round, "
            "whenever the study stopped, so alpha bounds the chance of any wrong winner or wrong equivalence. "
            "Equivalent: the interval inside +-margin (checked first); a side better: the interval excludes 0. "
            "Recomputed here from the run folders; the seed-level variance is floored by the items' noise, as in "
            "the fixed-n tests.",
            f"Compute: {fmt(compute['tokens'])} training tokens"
            + (f", {fmt_seconds(compute['device_seconds'])} of device time" if compute["device_seconds"] else "")
            + (
                f": {compute['fixed_design_share']:.0%} of a fixed design of {compute['fixed_design_seeds']} seeds "
                f"per variant ({fmt(compute['fixed_design_tokens'])} tokens)"
                if compute["fixed_design_share"] is not None
                else ""
            )
            + ".",
        ],
    )
    if seq["rule_changed_after_results"]:
        sec.paragraphs.append(
            "FLAGGED: the decision rule changed after results were seen ("
            + "; ".join(seq["rule_changes"])
            + "). The guarantee above assumes a rule fixed before any result; it does not hold for this study."
        )
    rows = [
        [
            c["metric"],
            f"{c['a']} vs {c['b']}",
            _decision(c),
            str(c["seeds"]),
            "" if c["decided_at"] is None else str(c["decided_at"]),
            fmt(c["estimate"]),
            _interval(c),
            "none" if c["margin"] is None else f"+-{c['margin']:g}",
            c["note"],
        ]
        for c in seq["contrasts"]
    ]
    header = ["metric", "contrast", "decision", "paired seeds", "decided at", "a - b", "anytime interval", "margin"]
    sec.tables.append(("Contrasts (a - b on the metric's scale)", [*header, "note"], rows))
    return sec


def _margin(value) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, "g")


def _end(value, unbounded: str) -> str:
    return unbounded if value is None else f"{value:+.4g}"


def contrast_line(c: dict) -> str:
    """One contrast of a study (a Contrast's to_dict()): open or decided, seeds, the interval of a - b."""
    verdict = {
        "a": f"decided: {c['a']} better",
        "b": f"decided: {c['b']} better",
        "equivalent": f"decided: equivalent within +-{_margin(c.get('margin'))}",
    }.get(c["decision"], "open")
    interval = c.get("interval")  # an end not bounded yet is null
    shown = f"[{_end(interval[0], '-inf')}, {_end(interval[1], '+inf')}]" if interval else "none yet"
    note = f"; {c['note']}" if c.get("note") else ""
    return f"{c['metric']}  {c['a']} vs {c['b']}: {verdict}  ({c['seeds']} seeds, interval of a-b {shown}{note})"
