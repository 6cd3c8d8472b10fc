"""Which signal to trust at which scale: for every task x metric of the largest scale, its SNR at each scale and
how well its ranking of the variants at each smaller scale predicts the rankings that decide at the largest.

Decision accuracy as DataDecide (Magnusson et al., AI2 2025) defines it: the share of variant pairs a small-scale
proxy metric orders as the TARGET orders them at the largest scale. Three figures per smaller scale:
- decision_accuracy: against the task's primary metric at the largest scale (validation loss: its own loss);
- decision_accuracy_val: against validation loss at the largest scale, the second target;
- self_agreement: against the same metric at the largest scale (whether the metric agrees with itself).
Each side is oriented by its own direction. A target at chance at the largest scale (an accuracy that is not past
chance) has no ranking to validate against: the entry says so (target_valid False). Its interval (stats/da.py): a
bootstrap of seeds (the variants sharing a seed kept together) and of the items every seed scored (the noise
model's persistent part), shown only where its measured coverage holds. SNR is
describe.signal_noise at that scale (quality.py's figures); render.py lays these figures out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ablate.report.inputs.runs import LOGGED_TASK, VAL_TASK, sign_of
from ablate.report.schema import AcrossScales, Group, ScaleRow, Series
from ablate.report.schema.signal import MetricRef
from ablate.report.stats import da, describe


@dataclass(frozen=True)
class Resample:
    """A series' working data for the DA bootstrap, not a figure: analyze.analyze_series returns it beside the
    series. ids: the compared item ids or None; items: {variant: (seeds, items) values} or None; stderr: {variant:
    {seed: logged stderr at the compared point}}."""

    ids: list | None
    items: dict[str, np.ndarray] | None
    stderr: dict[str, dict]


# Each group's Resample per series, aligned with the groups: {(task, metric): Resample}.
Resamples = list[dict[tuple[str, str], Resample]]


def _find(group: Group, task: str, metric: str | None = None) -> Series | None:
    """A group's series of a task x metric; with metric None, the task's primary metric."""
    return next(
        (s for s in group.series if s.task == task and (s.metric == metric if metric is not None else s.primary)),
        None,
    )


def _shared(a: Series | None, b: Series | None) -> list[str]:
    return [v for v in b.final if v in a.final] if a is not None and b is not None else []


def agreement(small: Series | None, large: Series | None) -> tuple[float | None, float | None]:
    """(decision accuracy, Kendall tau) of the small series' final ranking against the large one's, each oriented
    by its own direction, over the variants both have."""
    variants = _shared(small, large)
    if len(variants) < 2:
        return None, None
    guess = [sign_of(small.direction) * small.final[v].mean for v in variants]
    truth = [sign_of(large.direction) * large.final[v].mean for v in variants]
    return describe.decision_accuracy(guess, truth), describe.kendall(guess, truth)


def da_scale(s: Series, work: Resample, variants: list[str]) -> da.Scale:
    """What the DA bootstrap resamples at one scale: each variant's {seed: oriented run score}, and its runs'
    oriented per-item values or, without per-item files, its mean logged stderr^2 (the series' Resample)."""
    sign = sign_of(s.direction)
    scores = [{k: sign * x for k, x in zip(s.final[v].seeds, s.final[v].values)} for v in variants]
    if work.items is not None:
        items = [dict(zip(s.final[v].seeds, sign * work.items[v])) for v in variants]
        return da.Scale(scores, items, work.ids)
    logged = [[e for e in work.stderr[v].values() if e is not None] for v in variants]
    item_var = [float(np.mean(np.square(e))) if e else None for e in logged]
    return da.Scale(scores, item_var=item_var)


def _key(s: Series) -> tuple[str, str]:
    return s.task, s.metric


def _row(
    group: Group,
    small: Series,
    target: Series | None,
    val: Series | None,
    same: Series | None,
    work: tuple[dict, dict],
    opts,
) -> ScaleRow | None:
    """One smaller scale's row; work: the (small, largest) scales' Resamples."""
    target_da, tau = agreement(small, target)
    val_da, _ = agreement(small, val)
    self_da, _ = agreement(small, same)
    if target_da is None and val_da is None and self_da is None:
        return None
    variants = _shared(small, target) or _shared(small, same)
    seeds = min((len(s.final[v].values) for s in (small, target or same) for v in variants), default=0)
    shown = da.DAInterval()  # not computed: no target to agree with
    if target_da is not None:
        small_work, large_work = work[0][_key(small)], work[1][_key(target)]
        scales = da_scale(small, small_work, variants), da_scale(target, large_work, variants)
        shown = da.shown_interval(*scales, seeds, opts.bootstrap, opts.seed)
    return ScaleRow(
        scale=group.scale,
        variants=variants,
        seeds=seeds,
        snr=small.quality.snr,
        decision_accuracy=target_da,
        decision_accuracy_val=val_da,
        self_agreement=self_da,
        tau=tau,
        ci=shown.ci,
        ci_note=shown.ci_note,
        paired=shown.paired,
        coverage=shown.coverage,
        item_noise=shown.item_noise,
    )


def across_scales(groups: list[Group], resamples: Resamples, opts) -> list[AcrossScales]:
    """Every task x metric of the largest scale with a row at a smaller scale (schema.AcrossScales), validation loss
    first; [] without a smaller scale. resamples: each group's Resamples."""
    if len(groups) < 2:
        return []
    largest, out = groups[-1], []
    val = _find(largest, VAL_TASK)
    for same in largest.series:
        target = same if same.task == LOGGED_TASK else _find(largest, same.task)  # a logged key: its own target
        rows = []
        for group, work in zip(groups[:-1], resamples[:-1]):
            small = _find(group, same.task, same.metric)
            row = _row(group, small, target, val, same, (work, resamples[-1]), opts) if small is not None else None
            if row is not None:
                rows.append(row)
        if not rows:
            continue
        out.append(
            AcrossScales(
                task=same.task,
                metric=same.metric,
                direction=same.direction,
                primary=same.primary,
                snr=same.quality.snr,
                target=None if target is None else MetricRef(task=target.task, metric=target.metric),
                # an accuracy at chance at the largest scale has no ranking to validate a proxy against
                target_valid=target is not None and target.quality.criteria.above_chance is not False,
                by_scale=rows,
                mean_decision_accuracy=describe.mean_or_none([r.decision_accuracy for r in rows]),
                mean_decision_accuracy_val=describe.mean_or_none([r.decision_accuracy_val for r in rows]),
                mean_self_agreement=describe.mean_or_none([r.self_agreement for r in rows]),
            )
        )
    return out


def entry(across: list[AcrossScales], task: str, metric: str) -> AcrossScales | None:
    """A task x metric's across-scales entry (None without a scale axis or without the metric at a smaller scale)."""
    return next((a for a in across if (a.task, a.metric) == (task, metric)), None)
