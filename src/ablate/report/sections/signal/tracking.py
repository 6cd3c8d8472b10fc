"""Whether a continuous metric tracks its task: the evidence it needs before it can decide the task.

A continuous metric (no chance level: gold_bpb, correct_prob, margin_loglik, gold_logprob...) can be monotone and
consistent while measuring something other than the task (how much the model likes any answer text). It enters the
decisions only with evidence that it follows the task:
- with a scale axis: its decision accuracy from the smaller scales against the task's primary metric at the largest
  (mean over the smaller scales) must be > MIN_DA; against validation loss where that target is at chance;
- without one: whether it orders the variants as the task's accuracy does, at equal training: Kendall tau between
  the variants' mean metric and mean accuracy (both oriented) at each checkpoint every run shares, averaged over
  those checkpoints, must be >= MIN_TAU; where the accuracy is at chance (its ranking is noise), against validation
  loss instead, labelled as the weaker evidence it is (it says the metric follows language-model quality, not the
  task). Never a correlation pooled over (run, checkpoint) points: two metrics that both improve with training
  correlate through progress alone, even when they order the variants oppositely.
Accuracies, validation loss and baselines are not checked here: they keep their own gates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ablate.report.stats import describe
from ablate.report.inputs.runs import VAL_TASK, is_accuracy, sign_of
from ablate.report.schema import Series
from ablate.report.schema.signal import TracksTask

MIN_TAU = 0.5  # least mean Kendall tau of the variants' ranking; above 1/3, what one swap among three variants gives
MIN_DA = 0.5  # decision accuracy must beat a coin flip


def needs_tracking(s: Series) -> bool:
    """A continuous metric of a task (validation loss is its own target; baselines never pass anyway)."""
    return s.chance is None and s.task != VAL_TASK and not s.baseline


def at_chance(s: Series | None) -> bool:
    """An accuracy shown to be at chance (or not past its choices-only baseline): it has no ranking to follow."""
    return s is not None and s.quality.criteria.above_chance is False


def task_accuracy(task_series: list[Series]) -> Series | None:
    """The accuracy a task's metrics are checked against: its primary metric when that is an accuracy, else its
    first accuracy that is not a baseline; None when the task logs no accuracy."""
    accuracies = [s for s in task_series if is_accuracy(s.metric) and not s.baseline]
    return next((s for s in accuracies if s.primary), accuracies[0] if accuracies else None)


def _oriented(s: Series) -> dict[str, dict[int, float]]:
    sign = sign_of(s.direction)
    return {label: dict(zip(r.steps, (sign * v for v in r.values))) for label, r in s.runs.items()}


def ranking_agreement(metric: Series, reference: Series) -> float | None:
    """Kendall tau-b between the variants' mean metric and their mean reference (each oriented by its direction,
    over the runs both series scored) at each step all those runs share, averaged over the steps where the
    reference orders the variants at all. Positive: the metric ranks the variants as the reference does. None with
    fewer than 2 variants or no such step."""
    mine, theirs = _oriented(metric), _oriented(reference)
    runs = sorted(set(mine) & set(theirs))
    variant = {r: metric.runs[r].variant for r in runs}
    variants = sorted(set(variant.values()))
    if len(variants) < 2:
        return None
    steps = set.intersection(*(set(mine[r]) & set(theirs[r]) for r in runs))
    taus = []
    for step in sorted(steps):
        means = [
            [float(np.mean([series[r][step] for r in runs if variant[r] == v])) for v in variants]
            for series in (mine, theirs)
        ]
        tau = describe.kendall(*means)
        if tau is not None:  # None: the reference ties every variant there
            taus.append(tau)
    return float(np.mean(taus)) if taus else None


@dataclass(frozen=True)
class Tracking:
    """The evidence (tracks_task, as the choice records it) and why it fails, in words (None when it passes)."""

    evidence: TracksTask
    why: str | None

    @property
    def passes(self) -> bool:
        return self.evidence.passes


def _result(against: str, value: float | None, passes: bool, why: str | None, weaker: str | None = None) -> Tracking:
    """weaker: why the evidence is validation loss, the weaker one (None when it is not)."""
    return Tracking(TracksTask(against=against, value=value, passes=passes, weaker=weaker), why)


def from_scales(task_name: str, target_metric: str | None, da: float | None, by_val: bool) -> Tracking:
    """The evidence with a scale axis: mean DA against the target (by_val: against validation loss, the target
    being at chance or missing)."""
    against, label = ("val_da", "validation loss") if by_val else ("target_da", f"{task_name}'s {target_metric}")
    if da is None:
        return _result(against, None, False, f"tracking its task not computable (no DA against {label})")
    why = None if da > MIN_DA else f"does not track {label} across scales (DA {da:.3g} <= {MIN_DA:g})"
    return _result(against, da, da > MIN_DA, why)


def from_runs(task_name: str, s: Series, task_series: list[Series], val: Series | None) -> Tracking:
    """The evidence without a scale axis: the variants' ranking by the metric against their ranking by the task's
    accuracy, checkpoint by checkpoint, or by validation loss where the accuracy is at chance or absent (the weaker
    evidence)."""
    accuracy = task_accuracy(task_series)
    if accuracy is not None and not at_chance(accuracy):
        against, label, note = accuracy.metric, f"{task_name}'s accuracy", ""
        tau = ranking_agreement(s, accuracy)
    else:
        state = "at chance" if accuracy is not None else "not logged"
        against, label, note = "val_loss", "validation loss", f"; {task_name}'s accuracy is {state}"
        tau = ranking_agreement(s, val) if val is not None else None
    weaker = note[2:] or None
    if tau is None:
        why = f"tracking its task not computable (no ranking of the variants by {label}{note})"
        return _result(against, None, False, why, weaker)
    why = None if tau >= MIN_TAU else f"does not rank the variants as {label} does (tau {tau:.3g} < {MIN_TAU:g}{note})"
    return _result(against, tau, tau >= MIN_TAU, why, weaker)
