"""Which metric each task enters the decision set through: every metric is a candidate, judged by what the runs show.

Gates (analyze.py puts them in each series' quality["criteria"]): monotone over training (mean Spearman rho of score
vs step >= min_monotonicity), ranking consistent over checkpoints (mean Kendall tau over the second half >=
min_tau), SNR >= min_snr when one is set, and, for metrics that have a chance level (accuracies, zero-chance
margins), above chance: an accuracy at chance never counts, and accuracies that do not divide answer priors out
(all but acc_pmi) must also beat the choices-only baseline. The baselines themselves are never candidates.

A continuous metric (no chance level) must also show that it tracks its task (tracking.py): decision accuracy
against the task's target > 0.5 with a scale axis, else the variants ranked as the task's accuracy ranks them (mean
Kendall tau over checkpoints >= 0.5; against validation loss where the accuracy is at chance: weaker evidence).

Among the metrics that pass, the best measured ("evidence"): with a scale axis the highest decision accuracy from
the smaller scales against the task's target at the largest ("target_da", across.py), or against validation loss
where the target is at chance there ("val_da"); then the highest SNR, then monotonicity, then tau (without a scale
axis these alone: "consistency"); remaining ties go to the task's primary metric. Every key measures signal, noise
or agreement between rankings and is symmetric in the variants: which variant a metric favours never enters the
choice, so choosing cannot make a winner.
"""

from __future__ import annotations

import math

import numpy as np

from ablate.report.inputs.runs import VAL_TASK, TaskInfo, sign_of, task_label
from ablate.report.schema import AcrossScales, Choice, Group, Recommendation, Series
from ablate.report.schema.signal import Aggregate, Figures, OtherMetric, Rejected, SuiteEntry, Thresholds
from ablate.report.sections.signal import tracking
from ablate.report.sections.signal.across import entry
from ablate.report.stats import describe


def _f(x, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    return "0" if abs(x) < 1e-9 else f"{x:.{digits}g}"  # float rounding of an exact 0 (a score exactly at chance)


DA_LABEL = {"target_da": "DA", "val_da": "DA vs val loss", "consistency": "DA"}
USED_INSTEAD = "used instead: decision accuracy against validation loss"
CANNOT_VALIDATE = (
    "cannot be validated against its accuracy at these scales (at the largest scale the accuracy is at chance or "
    "not past its choices-only baseline); " + USED_INSTEAD
)


def figures(s: Series, da: float | None, tracks: tracking.Tracking | None = None) -> Figures:
    q = s.quality
    return Figures(
        monotonicity=q.monotonicity,
        snr=q.snr,
        tau=q.ranking.tau_second_half,
        decision_accuracy=da,  # against the evidence's target (target_da or val_da); None without a scale axis
        tracks_task=None if tracks is None else tracks.evidence,
    )


def evidence(task_key: str, series: list[Series], across: list[AcrossScales]) -> tuple[str, AcrossScales | None]:
    """What ranks a task's metrics, with the task's across-scales entry of any metric (its target is the task's):
    "target_da" with a scale axis and a usable target, "val_da" where the target is at chance (or missing) at the
    largest scale, "consistency" without a scale axis."""
    found = next((e for s in series if (e := entry(across, task_key, s.metric)) is not None), None)
    if found is None:
        return "consistency", None
    return ("target_da" if found.target_valid else "val_da"), found


def _da(e: AcrossScales | None, ranked_by: str) -> float | None:
    if e is None or ranked_by == "consistency":
        return None
    return e.mean_decision_accuracy if ranked_by == "target_da" else e.mean_decision_accuracy_val


def _tracks(
    name: str,
    s: Series,
    series: list[Series],
    val: Series | None,
    ranked_by: str,
    found: AcrossScales | None,
    da: float | None,
) -> tracking.Tracking | None:
    """tracking.py's evidence for a continuous metric; None for the metrics that keep their own gates."""
    if not tracking.needs_tracking(s):
        return None
    if ranked_by == "consistency":
        return tracking.from_runs(name, s, series, val)
    target = found.target.metric if found and found.target else None
    return tracking.from_scales(name, target, da, by_val=ranked_by == "val_da")


def _failures(s: Series, opts, tracks: tracking.Tracking | None = None) -> list[str]:
    """Why a metric fails its gates, with the figure against the threshold."""
    q, out = s.quality, []
    c, crit = q.chance, q.criteria
    if crit.above_chance is False:
        if c.z_final is not None and c.z_final < opts.min_z:
            out.append(f"at chance (z {_f(c.z_final)} < {opts.min_z:g})")
        else:
            out.append(f"not past the choices-only baseline (gain z {_f(c.gain_z)} < {opts.min_z:g})")
    if crit.monotone is False:
        out.append(f"not monotone (rho {_f(q.monotonicity)} < {opts.min_monotonicity:g})")
    if crit.consistent is False:
        out.append(f"ranking not consistent (tau {_f(q.ranking.tau_second_half)} < {opts.min_tau:g})")
    if crit.snr is False:
        out.append(f"SNR {_f(q.snr)} < {opts.min_snr:g}")
    out += [f"{name.replace('_', ' ')} not computable" for name, ok in crit.applied().items() if ok is None]
    if tracks is not None and not tracks.passes:
        out.append(tracks.why)
    return out


def _key(fig: Figures) -> tuple:
    """Higher is better measured: decision accuracy across scales (-1 when not measured), SNR, rho, tau."""
    return tuple(
        -math.inf if x is None else x
        for x in (
            -1.0 if fig.decision_accuracy is None else fig.decision_accuracy,
            fig.snr,
            fig.monotonicity,
            fig.tau,
        )
    )


def _lost_on(mine: Figures, best: Figures, ranked_by: str) -> str:
    for name, label in (
        ("decision_accuracy", DA_LABEL[ranked_by]),
        ("snr", "SNR"),
        ("monotonicity", "rho"),
        ("tau", "tau"),
    ):
        a, b = getattr(mine, name), getattr(best, name)
        if (a if a is not None else -math.inf) != (b if b is not None else -math.inf):
            return f"passes; lower {label} ({_f(a)} vs {_f(b)})"
    return "passes; tied, the primary metric or the first listed is taken"


def _describe(metric: str, fig: Figures, ranked_by: str) -> str:
    da = fig.decision_accuracy
    da = "" if da is None else f", {DA_LABEL[ranked_by]} {_f(da)} from smaller scales"
    tracks = fig.tracks_task
    if tracks is not None and tracks.against not in ("target_da", "val_da"):  # the DA above says it otherwise
        weaker = f" (weaker evidence: {tracks.weaker})" if tracks.weaker else ""
        da += f", tracks {tracks.against}: tau {_f(tracks.value)}{weaker}"
    return f"{metric} (rho {_f(fig.monotonicity)}, SNR {_f(fig.snr)}, tau {_f(fig.tau)}{da})"


def _caveat(name: str, task_key: str, ranked_by: str, found: AcrossScales | None) -> str:
    """What the choice says when the task's target could not rank its metrics."""
    if ranked_by != "val_da" or task_key == VAL_TASK:
        return ""
    if found.target is None:
        return f". {name} has no target metric at the largest scale; used instead: {USED_INSTEAD}"
    return f". {name} {CANNOT_VALIDATE}"


def choose(task: TaskInfo, series: list[Series], across: list[AcrossScales], opts, val: Series | None = None) -> Choice:
    """One task: the metric it enters through (or none), its figures, the evidence that ranked them, and why each
    other metric lost. val: the group's validation loss series (what a continuous metric is checked against
    without a scale axis when the task's accuracy is at chance)."""
    series = sorted(series, key=lambda s: not s.primary)  # ties go to the primary
    name = task_label(task.key)
    ranked_by, found = evidence(task.key, series, across)
    figs, tracks = {}, {}
    for s in series:
        da = _da(entry(across, task.key, s.metric), ranked_by)
        tracks[s.metric] = _tracks(name, s, series, val, ranked_by, found, da)
        figs[s.metric] = figures(s, da, tracks[s.metric])
    # a continuous metric must also track its task (tracks None: the metric keeps its own gates)
    passing = [s for s in series if s.quality.passes and (tracks[s.metric] is None or tracks[s.metric].passes)]
    top = max(passing, key=lambda s: _key(figs[s.metric])) if passing else None
    others, outright = [], []
    for s in series:
        if s is top:
            continue
        if s.baseline:
            why = "a baseline (answer priors), never a signal"
        elif s.diagnostic:
            why = "answer-blind (the same whichever choice is gold): a diagnostic, never a decision metric"
        elif s.metric in {p.metric for p in passing}:
            why = _lost_on(figs[s.metric], figs[top.metric], ranked_by)
        else:
            fails = _failures(s, opts, tracks[s.metric])
            outright.append(any("not computable" not in f for f in fails))
            why = "; ".join(fails)
        others.append(OtherMetric(metric=s.metric, why=why))
    lost = "; ".join(f"{o.metric}: {o.why}" for o in others)
    caveat = _caveat(name, task.key, ranked_by, found)
    if top is not None:
        text = f"{name}: {_describe(top.metric, figs[top.metric], ranked_by)}{caveat}"
        text += f". Others: {lost}" if lost else ""
        status = "chosen"
    else:
        status = "no_signal" if all(outright) else "not_assessable"
        head = "a decision metric whatever its criteria" if task.key == VAL_TASK else "no metric passes"
        text = f"{name}: {head}{caveat}. {lost}"
    return Choice(
        task=task.key,
        metric=top.metric if top else None,
        status=status,
        evidence=ranked_by,
        figures=figs[top.metric] if top else None,
        others=others,
        text=text,
        direction=top.direction if top else None,
        passing_metrics=[s.metric for s in passing],
    )


def suite_series(group: Group, suite: list[SuiteEntry]) -> list[Series]:
    """The group's series of validation loss (or its bits per byte: the val task holds one, bpb when tokenizers
    differ), then each suite task's chosen metric, each series once: what the aggregate is over (the
    recommendation's aggregate_over), and what the decisions rest on after the primary metric
    (sections/decisions/families.decision_series reads them from aggregate_over)."""
    keys = [(VAL_TASK, "loss"), (VAL_TASK, "bpb")] + [(e.task, e.metric) for e in suite if e.task != VAL_TASK]
    by_key = {(s.task, s.metric): s for s in group.series}
    return [by_key[k] for k in dict.fromkeys(keys) if k in by_key]


def recommendation(group: Group, tasks: dict[str, TaskInfo], across: list[AcrossScales], opts) -> Recommendation:
    """Each task's choice (validation loss's too: it is always a decision metric), the suite of chosen metrics, the
    tasks without one, and the aggregate over the decision metrics."""
    choices, suite, rejected = [], [], []
    val = next((s for s in group.series if s.task == VAL_TASK and s.primary), None)
    for task in tasks.values():
        mine = [s for s in group.series if s.task == task.key]
        if not mine:
            continue
        c = choose(task, mine, across, opts, val)
        choices.append(c)
        if c.metric is not None:
            suite.append(
                SuiteEntry(task=c.task, metric=c.metric, direction=c.direction, passing_metrics=c.passing_metrics)
            )
        else:
            rejected.append(Rejected(task=task.key, status=c.status, reasons={o.metric: o.why for o in c.others}))
    aggregate = {}
    variants = group.variants
    # over the decision metrics only: validation loss and the suite (a task at chance would add noise, not signal)
    chosen = suite_series(group, suite)
    if chosen and len(variants) >= 2:
        zs, ranks = {v: [] for v in variants}, {v: [] for v in variants}
        for s in chosen:
            sign = sign_of(s.direction)
            names = [v for v in variants if v in s.final]
            m = np.array([sign * s.final[v].mean for v in names])
            z = (m - m.mean()) / m.std() if m.std() > 0 else np.zeros_like(m)
            order = (-m).argsort(kind="stable").argsort() + 1  # rank 1 = best
            for v, zv, rv in zip(names, z, order):
                zs[v].append(float(zv))
                ranks[v].append(int(rv))
        aggregate = {
            v: Aggregate(
                mean_z=describe.mean_or_none(zs[v]), mean_rank=describe.mean_or_none(ranks[v]), tasks=len(zs[v])
            )
            for v in variants
        }
    return Recommendation(
        thresholds=Thresholds(
            min_monotonicity=opts.min_monotonicity, min_z=opts.min_z, min_tau=opts.min_tau, min_snr=opts.min_snr
        ),
        choices=choices,
        suite=suite,
        rejected=rejected,
        aggregate=aggregate,
        aggregate_over=[[s.task, s.metric] for s in chosen],
    )
