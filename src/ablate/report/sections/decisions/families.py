"""The study's error control and what decisions rest on.

- Decision metrics: the primary metric (validation loss, or bits per byte across tokenizers, or `--primary`) and,
  per task, the best measured metric that passes the criteria (the recommendation: sections/signal/choose.py). A
  task where no metric does is "no signal here": never a win or a loss.
- Error control over the whole study, in two families (a fallback procedure): the primary metric's pairs are
  declared before any result and tested as their own question, Benjamini-Hochberg at alpha x primary_share (0.04);
  every pair x candidate task metric (every metric the choice could have picked: choosing a metric, and its gates,
  select on the runs' own outcome) is the second family, Benjamini-Hochberg at the rest of alpha (0.01), or at the
  whole alpha when the primary family tested at least one pair and rejected every pair it tested (its alpha is then
  unspent: carried forward; a primary family that tested nothing carries nothing).
  In an A/A study the chance of any claim is at most alpha1 + alpha2 = alpha; within each family BH bounds the
  false discovery rate at its level.
- Seeds needed are computed for the level a pair is actually tested at: its family's alpha over the family's size
  (Benjamini-Hochberg's first step, where a lone real effect must pass), with the range that an sd estimated from
  k seeds leaves (80% chi-square interval).
- The winner: the variant significantly best on some decision metric and behind on none, never one with a failed
  or diverged seed.

`apply_family` and `winner` are what the report runs; the calibration (report/calibrate.py) runs the same
functions on simulated studies.
"""

from __future__ import annotations

import dataclasses

from ablate.report.inputs import logged
from ablate.report.inputs.runs import LOGGED_TASK, VAL_TASK, task_label
from ablate.report.schema import Decision, Family, Group, Inference, Pairwise, Recommendation, Series
from ablate.report.stats.power import bh_adjust, items_limit, sd_interval, seeds_needed


def is_primary(s: Series, opts) -> bool:
    """The study's primary metric: `opts.primary` ("task" for its primary metric, "task/metric", or a logged
    metrics.jsonl key), else validation loss (its bits per byte when the runs' tokenizers differ: the val task then
    holds only that)."""
    want = getattr(opts, "primary", None) or VAL_TASK
    if s.task == LOGGED_TASK and logged.is_named(want, s.metric):
        return True
    task, _, metric = want.partition("/")
    if s.task != task:
        return False
    return s.metric == metric if metric else (s.primary or s.task == VAL_TASK)


def _bh(rows: list[Pairwise], alpha: float, name: str, power: float, **family) -> tuple[list[Pairwise], Family]:
    """Benjamini-Hochberg at `alpha` over the testable rows: the rows as tested (new rows with family, p_bh,
    significant, seeds needed) and the family's summary; family: its metrics (and carried_forward)."""
    tested = [i for i, p in enumerate(rows) if p.testable]
    adjusted = dict(zip(tested, bh_adjust([rows[i].p_seeds for i in tested])))
    step = alpha / max(1, len(rows))  # where a lone real effect must pass once every pair is tested
    out = [_as_tested(p, name, adjusted.get(i), alpha, step, power) for i, p in enumerate(rows)]
    return out, Family(
        name=name,
        alpha=alpha,
        comparisons=len(rows),
        tests=len(tested),
        rejected=sum(bool(out[i].significant) for i in tested),
        first_step_alpha=step,
        **family,
    )


def _as_tested(p: Pairwise, family: str, p_bh: float | None, alpha: float, step: float, power: float) -> Pairwise:
    """One row in its family: its adjusted p and significance where it was tested; where it is not significant,
    the seeds it would need at the family's first step (and their range), or that only more items can settle it."""
    p = dataclasses.replace(p, family=family)
    if p_bh is not None:
        p = dataclasses.replace(p, p_bh=p_bh, significant=bool(p_bh < alpha))
    if p.significant:
        return p  # established: no seeds needed
    items = ((p.item_sd or 0.0) ** 2, p.item_df)  # the persistent item term: no seed count removes it
    need = seeds_needed(p.diff, p.sd_diff, step, power, p.paired, *items)
    have = p.n_seeds if p.paired else min(p.n_seeds_a, p.n_seeds_b)
    if need is not None and p.untested == "seeds":  # too few to be tested: at least one more
        need = max(need, have + 1)
    more_items = items_limit(p.diff, step, power, *items)
    seed_df = p.n_seeds - 1 if p.paired else p.n_seeds_a + p.n_seeds_b - 2
    interval = sd_interval(p.sd_seeds, seed_df) if p.sd_seeds is not None and seed_df else None
    span = p.seeds_needed_range
    if need is not None and interval is not None and not more_items:
        # the fresh floor stays: a true seed sd below it still leaves each evaluation's answer noise
        sds = [max(x, p.noise_floor_sd or 0.0) for x in interval]
        span = [seeds_needed(p.diff, sd, step, power, p.paired, *items) for sd in sds]
    return dataclasses.replace(p, seeds_needed=need, more_items=more_items, seeds_needed_range=span)


def _tested(series: list[Series], rows: list[Pairwise]) -> list[Series]:
    """The series again, each with its run of the family's tested rows (in the order they were flattened)."""
    out, start = [], 0
    for s in series:
        out.append(dataclasses.replace(s, pairwise=rows[start : start + len(s.pairwise)]))
        start += len(s.pairwise)
    return out


def apply_family(
    series: list[Series], opts, where: str, decisions: list[Series] | None = None
) -> tuple[Inference, list[Series]]:
    """The study's error control over the given series: the primary metric's pairs first at alpha x primary_share,
    then every other series' pairs at the rest of alpha, or at all of it when the primary family tested pairs and
    rejected each. Returns the inference summary and the series as tested (new series, in the given order, whose
    pairwise rows carry family, p_bh, significant, seeds_needed; rows that cannot be tested keep significant None).
    decisions: the series decisions are read on (default: all)."""
    decisions = series if decisions is None else decisions
    primary = [s for s in series if is_primary(s, opts)]
    others = [s for s in series if not is_primary(s, opts)]
    alpha1 = opts.alpha * opts.primary_share
    metrics = {
        "primary": [[s.task, s.metric] for s in primary],
        "tasks": [[s.task, s.metric] for s in others],
    }
    primary_rows, first = _bh(
        [p for s in primary for p in s.pairwise], alpha1, "primary", opts.power, metrics=metrics["primary"]
    )
    # alpha1 is unspent only where the primary family tested something and rejected all of it (nothing left that
    # could be a false claim); a family that tested nothing has spent no evidence and carries nothing forward
    carried = first.tests > 0 and first.rejected == first.tests
    alpha2 = opts.alpha if carried else opts.alpha - alpha1
    rows = [p for s in others for p in s.pairwise]
    forward = carried and alpha2 > opts.alpha - alpha1
    other_rows, second = _bh(rows, alpha2, "tasks", opts.power, metrics=metrics["tasks"], carried_forward=forward)
    as_tested = dict(zip(map(id, primary + others), _tested(primary, primary_rows) + _tested(others, other_rows)))
    pairs = max((len(s.pairwise) for s in series), default=0)
    names = ", ".join(metric_label(s) for s in decisions)
    prim = ", ".join(metric_label(s) for s in primary) or "none"
    carried_text = " (the primary family rejected every pair it tested: its alpha carried forward)"
    text = f"{where}: primary metric {prim}, {first.comparisons} pair(s), Benjamini-Hochberg at {alpha1:g}"
    if others:
        text += (
            f"; task metrics (every candidate but the baselines and answer-blind diagnostics; decisions on {names}), "
            f"{pairs} pair(s) x {len(others)} metric(s) = {second.comparisons} comparisons, Benjamini-Hochberg "
            f"at {alpha2:g}" + (carried_text if second.carried_forward else "")
        )
    text += (
        f"; {first.tests + second.tests} of {first.comparisons + second.comparisons} comparisons tested "
        f"(>= {opts.min_seeds} seeds both variants ran); A/A any-claim rate <= {opts.alpha:g}"
    )
    if not first.comparisons + second.comparisons:
        text = f"no comparison {where}: fewer than 2 variants or no decision metric"
    inference = Inference(
        method="fallback over two families, Benjamini-Hochberg within each",
        alpha=opts.alpha,
        level="training seed",
        min_seeds=opts.min_seeds,
        power=opts.power,
        family=text,
        families=[first, second],
        tests=first.tests + second.tests,
        comparisons=first.comparisons + second.comparisons,
        metrics=[[s.task, s.metric] for s in decisions],
        family_metrics=[[s.task, s.metric] for s in series],
    )
    return inference, [as_tested[id(s)] for s in series]


def metric_label(s: Series) -> str:
    """A decision metric's short name: the task without ":cf", plus the metric when it is not the primary."""
    if s.task == LOGGED_TASK:
        return s.metric  # the key as logged
    name = task_label(s.task)
    if s.task == VAL_TASK:
        return "val_bpb" if s.metric == "bpb" else name
    return name if s.primary else f"{name} [{s.metric}]"


def winner(decisions: list[Decision], never: set[str] | frozenset = frozenset()) -> str | None:
    """The variant significantly best on some decision metric and significantly behind on none; None when no
    variant is, or when two are best on different metrics. `never`: variants with a failed or diverged seed,
    which cannot win on their surviving seeds."""
    tops = {d.leader for d in decisions if d.status == "best"}
    behind = {v for d in decisions if d.status in ("best", "ahead") for v in d.ahead_of}
    candidates = tops - behind - set(never)
    return next(iter(candidates)) if len(candidates) == 1 and len(tops) == 1 else None


def decision_series(group: Group, recommendation: Recommendation, opts=None) -> list[Series]:
    """The primary metric (validation loss unless opts.primary names a task's or a logged key), then the
    recommendation's decision metrics (its aggregate_over: validation loss, then each suite task's chosen metric; a
    task the primary names only once), then the logged keys declared (--metric: the series of LOGGED_TASK): the only
    series decisions rest on. Decisions take the recommendation as a value, made for this group
    (sections/signal/choose.py)."""
    primary = [(s.task, s.metric) for s in group.series if opts is not None and opts.primary and is_primary(s, opts)]
    taken = {task for task, _ in primary}
    chosen = [(task, metric) for task, metric in recommendation.aggregate_over if task == VAL_TASK or task not in taken]
    declared = [(s.task, s.metric) for s in group.series if s.task == LOGGED_TASK]
    by_key = {(s.task, s.metric): s for s in group.series}
    return [by_key[k] for k in dict.fromkeys([*primary, *chosen, *declared]) if k in by_key]


def family_series(group: Group, decisions: list[Series]) -> list[Series]:
    """The decision series, then every other candidate metric of the group (not the choices-only baselines nor the
    answer-blind diagnostics): the families, so that choosing among them cannot add a claim."""
    return decisions + [
        s for s in group.series if not s.baseline and not s.diagnostic and not any(s is d for d in decisions)
    ]
