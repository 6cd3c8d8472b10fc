"""Groups of a task averaged over groups (MMLU's subjects) whose SNR is below a floor: left out of its average, named.

Signal and Noise (Heineman et al., AI2 2025) cuts a benchmark's noise by keeping its subtasks of high SNR. Here a
group's SNR is measured per metric as any metric's is (describe.signal_noise: the variants' final group means against
each run's last `last_k` group means), and with `--subject-snr-floor X` the groups below X are left out of that
metric's average at every checkpoint of every run (and out of its per-item values: match.py).

Choosing groups on the very runs that are then compared would favour groups where these variants happen to differ
(in an A/A study, noise passed off as signal). So with a scale axis the groups are chosen on the smaller scales only
(their mean SNR) and applied alike at every scale: the largest, where decisions are made, never chooses. With one
scale the choice is in-sample, and the report says so. A group whose SNR cannot be computed is kept.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ablate.report.inputs.runs import Run, TaskInfo
from ablate.report.schema import SubjectFloor
from ablate.report.stats import describe


def _group_snr(by_variant: dict[str, list[Run]], key, group: str, last_k: int) -> float | None:
    finals, tails = [], []
    for runs in by_variant.values():
        series = [run.group_scores.get(key, {}).get(group) for run in runs]
        if not all(series):
            return None
        finals.append(float(np.mean([s[-1].value for s in series])))
        tails += [[p.value for p in s[-last_k:]] for s in series]
    return describe.signal_noise(finals, tails).snr


def _refiltered(run: Run, key, kept: set[str], n_groups: int) -> Run:
    """The run again, each evaluation's value the mean over the kept groups it logged; its standard error, logged
    for the mean over all groups, scaled by sqrt(all / kept) (groups of about equal standard error)."""
    by_group = run.group_scores.get(key, {})
    points = []
    for point in run.scores.get(key, []):
        values = [p.value for g in kept for p in by_group.get(g, []) if p.step == point.step]
        if values:
            stderr = None if point.stderr is None else point.stderr * math.sqrt(n_groups / len(values))
            point = dataclasses.replace(point, value=float(np.mean(values)), stderr=stderr)
        points.append(point)
    return dataclasses.replace(run, scores={**run.scores, key: points}) if key in run.scores else run


def _mean_snr(choosers: list, task: TaskInfo, key, last_k: int) -> dict[str, float | None]:
    """Each group's SNR, its mean over the scales that choose."""
    snr: dict[str, list[float]] = {g: [] for g in task.groups}
    for _, by_variant in choosers:
        finished = {
            v: [r for r in rs if r.status == "finished" and key in r.group_scores] for v, rs in by_variant.items()
        }
        finished = {v: rs for v, rs in finished.items() if rs}
        if len(finished) < 2:
            continue
        for group in task.groups:
            value = _group_snr(finished, key, group, last_k)
            if value is not None:
                snr[group].append(value)
    return {g: describe.mean_or_none(v) for g, v in snr.items()}


def _entry(task: TaskInfo, metric: str, mean_snr: dict, floor: float, scales: list, choosers: list) -> SubjectFloor:
    """report.json's subject_floor entry of a task x metric."""
    dropped = sorted(g for g, v in mean_snr.items() if v is not None and v < floor)
    kept = set(task.groups) - set(dropped)
    return SubjectFloor(
        task=task.key,
        metric=metric,
        floor=floor,
        dropped=dropped if kept else [],
        groups=len(task.groups),
        kept=len(kept) if kept else len(task.groups),
        snr=mean_snr,
        chosen_at=[scale for scale, _ in choosers],
        in_sample=len(scales) == 1,
        note="" if kept else "every group is below the floor: all kept",
    )


def _floored(scales: list, key, kept: set[str], n_groups: int) -> list:
    return [
        (scale, {v: [_refiltered(r, key, kept, n_groups) for r in rs] for v, rs in by_variant.items()})
        for scale, by_variant in scales
    ]


def apply_floor(
    scales: list[tuple[object, dict[str, list[Run]]]], tasks: dict[str, TaskInfo], opts
) -> tuple[list[SubjectFloor], list[tuple[object, dict[str, list[Run]]]], dict[str, TaskInfo]]:
    """Leave the groups below opts.subject_snr_floor out of each grouped task's metrics. Returns one entry per task x
    metric that had groups measured, naming what was left out; the scales with their runs' scores refiltered (new
    Runs where a score changed); and the tasks with their kept_groups (new TaskInfos). The arguments are left as
    they were."""
    floor = opts.subject_snr_floor
    if floor is None:
        return [], scales, tasks
    choosers = scales[:-1] if len(scales) > 1 else scales
    out, tasks = [], dict(tasks)
    for name, task in list(tasks.items()):
        for metric in task.metrics if task.groups else ():
            mean_snr = _mean_snr(choosers, task, (task.key, metric), opts.last_k)
            if all(v is None for v in mean_snr.values()):
                continue
            out.append(entry := _entry(task, metric, mean_snr, floor, scales, choosers))
            kept = set(task.groups) - set(entry.dropped)
            if entry.dropped:
                task = dataclasses.replace(task, kept_groups={**task.kept_groups, metric: kept})
                scales = _floored(scales, (task.key, metric), kept, len(task.groups))
        tasks[name] = task
    return out, scales, tasks
