"""A contrast in words: the study driver's lines, `ablate status`'s and the report's futility (the driver and
`ablate status` read no other wording)."""

from __future__ import annotations

import math

from ablate.report.sections.sequential.decide import CLOSED


def futility_text(
    chance: float | None, fixed_power: float | None, futility: float | None = None, max_seeds: int | None = None
) -> str:
    """'closed for futility (estimated chance of a decision < 0.1)', with the chance itself and the fixed design's
    power at the difference seen where the contrast records them (report.json's `chance` and `fixed_power`)."""
    below = f" < {futility:g}" if futility else " below the rule's futility threshold"
    text = f"closed for futility (estimated chance of a decision{below})"
    extra = []
    if chance is not None:
        extra.append(f"estimated chance {chance:.2f}")
    if fixed_power is not None:
        seeds = f"{max_seeds}-seed " if max_seeds else ""
        extra.append(f"a fixed {seeds}design's power at the difference seen {fixed_power:.2f}")
    return text + (f": {'; '.join(extra)}" if extra else "")


def _margin(value) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, "g")


def _end(value, unbounded: str) -> str:
    return unbounded if value is None else f"{value:+.4g}"


def contrast_line(c: dict, futility: float | None = None) -> str:
    """One contrast of a study (a Contrast's to_dict(), as study.json records it): open or decided, seeds, the
    interval of a - b. futility: the rule's threshold, named when a contrast is closed for futility."""
    verdict = {
        "a": f"decided: {c['a']} better",
        "b": f"decided: {c['b']} better",
        "equivalent": f"decided: equivalent within +-{_margin(c.get('margin'))}",
    }.get(
        c["decision"],
        futility_text(c.get("chance"), c.get("fixed_power"), futility) if c["decision"] in CLOSED else "open",
    )
    interval = c.get("interval")  # an end not bounded yet is null
    shown = f"[{_end(interval[0], '-inf')}, {_end(interval[1], '+inf')}]" if interval else "none yet"
    note = f"; {c['note']}" if c.get("note") else ""
    held = f", boundary |t| {c['boundary']:.3g}" if c.get("boundary") is not None else ""
    return f"{c['metric']}  {c['a']} vs {c['b']}: {verdict}  ({c['seeds']} seeds, interval of a-b {shown}{held}{note})"
