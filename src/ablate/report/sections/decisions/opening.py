"""The report's opening, read in ten seconds: the verdict, the decisions table and what they leave out (the
Headline), then the method once, folded away (HTML <details>), which every table below refers to."""

from __future__ import annotations

from ablate.report.inputs.runs import LOGGED_TASK
from ablate.report.options import Options
from ablate.report.schema import Report
from ablate.report.sections.decisions import verdict
from ablate.report.text.fmt import Section

DEFAULTS = Options()  # what a report.json written before an option existed was made with


def ci_level(options: dict) -> str:
    """The level of the report's t intervals, 1 - alpha, as a table shows it: '95%'."""
    return f"{1 - options.get('alpha', DEFAULTS.alpha):.0%}"


def headline_section(report: Report) -> Section:
    """The verdict in one or two sentences, the decisions table, then the notes (tasks without signal, runs left
    out)."""
    head = report.headline
    sec = Section("Headline", [head.verdict], after=list(head.notes))
    if head.compute:  # what each variant is worth in compute (report.multipliers)
        sec.paragraphs.append(head.compute)
    if head.decisions:
        caption, header, rows = verdict.table(head, report.options["power"])
        if report.sequential:
            caption = "Fixed-n tests (p-values not valid under optional stopping). " + caption
        sec.tables.append((caption, header, rows))
    return sec


def _error_control(family: str) -> str:
    """inference["family"] as a sentence: 'Error control (one scale): primary metric ...'."""
    return f"{family[0].upper()}{family[1:]}." if family.startswith("no comparison") else f"Error control {family}."


def method_section(report: Report) -> Section:
    """How scores are compared, tested and corrected for many comparisons: said once, for every table."""
    o, inference = report.options, report.inference
    k = o.get("average_last", DEFAULTS.average_last)
    averaged = (
        f" Each run's score is the mean of its last {k} evaluations up to the compared one (--average-last "
        f"{k}), per item where per-item files exist."
        if k > 1
        else ""
    )
    stopping = f" Under the adaptive study these are {inference.optional_stopping_note}." if report.sequential else ""
    level = ci_level(o)
    keys = [metric for task, metric in inference.metrics if task == LOGGED_TASK]
    declared = f", and the metrics.jsonl key(s) asked for ({', '.join(keys)})" if keys else ""
    return Section(
        "Method",
        [
            "Decisions rest on the primary metric and each task's best measured metric that passes the signal "
            f"criteria (see Recommendation){declared}, tested over training seeds." + averaged + stopping,
            "A run's score is its mean over the items every compared run scored, at the compared evaluation (equal "
            f"tokens: see each table). Mean and seed sd over seeds; {level} CI: a t interval over seeds under the "
            "tests' noise model (seed spread / seeds + the item set's sampling variance, Satterthwaite's df). "
            "Pairwise, diff = a - b, tested at the level of replication, the training seed: a paired t-test over the "
            "per-seed differences of the seeds both variants ran (Welch's t-test when they share fewer than 2), its "
            "variance floored by the items' own sampling noise of one difference, so a difference every seed repeats "
            f"is never p = 0; not tested with fewer than {o['min_seeds']} seeds, or where the compared points are more "
            f"than {o.get('max_token_gap', DEFAULTS.max_token_gap):.0%} apart in tokens (the note says which). The "
            f"pair's {level} CI is its test's own interval (same variance, df and level, before any adjustment for "
            f"many comparisons): it excludes 0 exactly when p (seeds) < {o.get('alpha', DEFAULTS.alpha):g}.",
            _error_control(inference.family) + " p_BH is Benjamini-Hochberg adjusted within the pair's family; "
            "significant: p_BH below its family's alpha, for tested pairs at the largest scale only (n/a elsewhere); "
            "decisions are read on the decision metrics alone.",
            f"Seeds needed: per variant, for {o['power']:.0%} power at the level the pair is tested at (its family's "
            "alpha / the family's size: Benjamini-Hochberg's first step), taking the observed difference as the one "
            "to detect and the test's noise (seed spread over the seeds, floored by fresh answer noise, plus the item "
            "set's persistent part, which seeds do not remove: 'more items, not more seeds' where that part alone "
            "hides the difference); in brackets the range over an 80% interval of the sd, which a few seeds leave "
            "wide. p (items): paired t-test over items with the seeds held fixed: evaluation noise only, never the "
            "decision.",
        ],
        folded="How scores are compared, tested and corrected for many comparisons",
    )
