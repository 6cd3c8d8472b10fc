"""An adaptive study (ablate run --until-decided) in the headline: its decisions lead, each contrast in words, how
the study stopped, and the note that labels the fixed-n tests beside them (not valid under optional stopping).

The contrasts are this section's (report.json's `sequential`); a decision's name is read through decide.py's
CLOSED, the one place that knows the word study.json files used before it changed. analyze hands this the headline
the decisions section wrote (sections/decisions/headline.py), and it adds the study's lead.
"""

from __future__ import annotations

import dataclasses

from ablate.report.schema.decisions import Headline
from ablate.report.schema.sequential import Contrast, Sequential
from ablate.report.sections.sequential.decide import CLOSED, FUTILE

OPTIONAL_STOPPING_NOTE = (
    "fixed-n p-values, not valid under optional stopping: the seeds were added where a decision was open, so these "
    "tests looked at the data after every round; the adaptive study's anytime-valid decisions are the ones to read"
)
_STOPPED = {
    "decided": "stopped: every contrast decided or closed",
    "max_seeds": "stopped at max seeds",
    "budget": "stopped by the budget",
}


def _contrast_text(c: Contrast, with_metric: bool, futility: float | None = None) -> str:
    """'slow worse than baseline, decided at 3 seeds', 'baseline vs twin equivalent within 0.01 at 5 seeds', or
    'baseline vs twin open at 6 seeds (interval [-0.02, 0.03])'."""
    name = f"{c.metric}: " if with_metric else ""
    if c.decision in ("a", "b"):
        better, worse = (c.a, c.b) if c.decision == "a" else (c.b, c.a)
        return f"{name}{worse} worse than {better}, decided at {c.decided_at} seeds"
    if c.decision == "equivalent":
        return f"{name}{c.a} vs {c.b} equivalent within {c.margin:g} at {c.decided_at} seeds"
    lo, hi = c.interval or (None, None)
    bounds = f" (interval [{lo:.3g}, {hi:.3g}])" if lo is not None and hi is not None else ""
    below = f" (estimated chance of a decision < {futility:g})" if futility else ""
    state = f"closed for futility{below}" if _state(c) == "futile" else "open"
    return f"{name}{c.a} vs {c.b} {state} at {c.seeds} seeds{bounds}"


def _state(c: Contrast) -> str:
    """A contrast's decision, "futile" also where study.json files before 2026-11-27 said "undecidable"."""
    return FUTILE if c.decision in CLOSED else c.decision


def sequential_text(section: Sequential) -> str:
    """The adaptive study in words: each contrast, the compute against a fixed design, how it stopped, and a flag
    where the rule changed after results were seen."""
    contrasts = section.contrasts
    several = len({c.metric for c in contrasts}) > 1
    still_open = [c for c in contrasts if c.decision == "open"]
    parts = []
    futility = section.rule.futility
    below = f" (estimated chance of a decision < {futility:g})" if futility else ""
    for state, word in (("open", "open"), ("futile", f"closed for futility{below}")):
        left = [c for c in contrasts if _state(c) == state]
        if len(left) > 3:  # one clause for many open (or closed) contrasts (the table lists each)
            seeds = sorted({c.seeds for c in left})
            at = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
            parts.append(f"{len(left)} of {len(contrasts)} contrasts {word} at {at} seeds (see the table)")
    many = {state for state in ("open", "futile") if sum(_state(c) == state for c in contrasts) > 3}
    parts[:0] = [_contrast_text(c, several, futility) for c in contrasts if _state(c) not in many]
    compute = section.compute
    if compute.fixed_design_share is not None:
        parts.append(f"{compute.fixed_design_share:.0%} of a fixed {compute.fixed_design_seeds}-seed design's compute")
    stopped = _STOPPED.get(section.stopped, "not stopped yet (rounds still to come)")
    if still_open and section.stopped != "decided" and len(still_open) <= 3:
        stopped += f", {len(still_open)} contrast(s) open"
    design = {"group_sequential": "group-sequential"}.get(section.design, "anytime-valid")
    text = "; ".join(parts) + f" ({stopped}; {design}, alpha {section.alpha:g} over the whole study)"
    if section.rule_changed_after_results:
        text += (
            ". FLAGGED: the decision rule changed after results were seen ("
            + "; ".join(section.rule_changes)
            + "), so the study's error guarantee does not hold"
        )
    return text


def sequential_headline(headline: Headline, section: Sequential, experiment: str) -> Headline:
    """The headline with the adaptive study first: its decisions, then the fixed-n view, labelled."""
    fixed = headline.text.removeprefix(f"{experiment}: ")
    said = sequential_text(section)
    return dataclasses.replace(
        headline,
        sequential=said,
        rule_changed_after_results=section.rule_changed_after_results,
        verdict=f"Adaptive study: {said}.",
        text=f"{experiment} (adaptive study): {said}. Fixed-n tests (p-values not valid under optional stopping): "
        f"{fixed}",
    )
