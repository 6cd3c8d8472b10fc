"""Whether a continuous metric tracks its task: the evidence it needs before it can decide the task.

A continuous metric (no chance level: gold_bpb, correct_prob, margin_loglik, gold_logprob...) can be monotone and
consistent while measuring something other than the task (how much the model likes any answer text). It enters the
decisions only with evidence that it follows the task:
- with a scale axis: its decision accuracy from the smaller scales against the task's primary metric at the largest
  (mean over the smaller scales) must be > MIN_DA; against validation loss where that target is at chance;
- without one: its Spearman correlation with the task's accuracy over the runs' (run, checkpoint) points, both
  oriented, must be >= MIN_RHO; where the accuracy is at chance (a correlation with it is noise), its correlation
  with validation loss instead, labelled as the weaker evidence it is (it says the metric follows language-model
  quality, not the task).
Accuracies, validation loss and baselines are not checked here: they keep their own gates.
"""

from __future__ import annotations

from ablate.report import stats
from ablate.report.runs import VAL_TASK, is_accuracy

MIN_RHO = 0.5  # least rank correlation with the task's accuracy (or validation loss) over (run, checkpoint) points
MIN_DA = 0.5  # decision accuracy must beat a coin flip


def needs_tracking(s: dict) -> bool:
    """A continuous metric of a task (validation loss is its own target; baselines never pass anyway)."""
    return s["chance"] is None and s["task"] != VAL_TASK and not s["baseline"]


def at_chance(s: dict | None) -> bool:
    """An accuracy shown to be at chance (or not past its choices-only baseline): it has no ranking to follow."""
    return s is not None and s["quality"]["criteria"].get("above_chance") is False


def task_accuracy(task_series: list[dict]) -> dict | None:
    """The accuracy a task's metrics are checked against: its primary metric when that is an accuracy, else its
    first accuracy that is not a baseline; None when the task logs no accuracy."""
    accuracies = [s for s in task_series if is_accuracy(s["metric"]) and not s["baseline"]]
    return next((s for s in accuracies if s["primary"]), accuracies[0] if accuracies else None)


def _oriented(s: dict) -> dict[str, dict[int, float]]:
    sign = 1 if s["direction"] == "higher" else -1
    return {label: dict(zip(r["steps"], (sign * v for v in r["values"]))) for label, r in s["runs"].items()}


def rank_correlation(metric: dict, reference: dict) -> float | None:
    """Spearman rho of two series of one group, each oriented by its own direction, pooled over (run, checkpoint)
    points: every run both series scored, at the steps all those runs share (so no run weighs more for having more
    checkpoints). Positive: the metric improves where the reference does."""
    mine, theirs = _oriented(metric), _oriented(reference)
    runs = sorted(set(mine) & set(theirs))
    if not runs:
        return None
    steps = set.intersection(*(set(mine[r]) & set(theirs[r]) for r in runs))
    points = [(r, step) for r in runs for step in sorted(steps)]
    return stats.spearman([mine[r][k] for r, k in points], [theirs[r][k] for r, k in points])


def _result(against: str, value: float | None, passes: bool, why: str | None, weaker: str | None = None) -> dict:
    """tracks_task as the choice records it. why: the reason it fails (None when it passes); weaker: why the
    evidence is validation loss, the weaker one (None when it is not)."""
    return {"against": against, "value": value, "passes": passes, "weaker": weaker, "why": why}


def from_scales(task_name: str, target_metric: str | None, da: float | None, by_val: bool) -> dict:
    """The evidence with a scale axis: mean DA against the target (by_val: against validation loss, the target
    being at chance or missing)."""
    against, label = ("val_da", "validation loss") if by_val else ("target_da", f"{task_name}'s {target_metric}")
    if da is None:
        return _result(against, None, False, f"tracking its task not computable (no DA against {label})")
    why = None if da > MIN_DA else f"does not track {label} across scales (DA {da:.3g} <= {MIN_DA:g})"
    return _result(against, da, da > MIN_DA, why)


def from_runs(task_name: str, s: dict, task_series: list[dict], val: dict | None) -> dict:
    """The evidence without a scale axis: rank correlation over the runs' checkpoints with the task's accuracy, or
    with validation loss where the accuracy is at chance or absent (the weaker evidence)."""
    accuracy = task_accuracy(task_series)
    if accuracy is not None and not at_chance(accuracy):
        against, label, note = accuracy["metric"], f"{task_name}'s accuracy", ""
        rho = rank_correlation(s, accuracy)
    else:
        state = "at chance" if accuracy is not None else "not logged"
        against, label, note = "val_loss", "validation loss", f"; {task_name}'s accuracy is {state}"
        rho = rank_correlation(s, val) if val is not None else None
    weaker = note[2:] or None
    if rho is None:
        why = f"tracking its task not computable (no rank correlation with {label}{note})"
        return _result(against, None, False, why, weaker)
    why = None if rho >= MIN_RHO else f"does not track {label} (rho {rho:.3g} < {MIN_RHO:g}{note})"
    return _result(against, rho, rho >= MIN_RHO, why, weaker)
