"""A variant's curve over its runs (mean, sd, min and max at the steps every run logged), and the curves of every
key a run logged into metrics.jsonl (report.json's groups[].logged)."""

from __future__ import annotations

import numpy as np

from ablate.report import schema
from ablate.report.inputs.logged import logged_keys
from ablate.report.inputs.runs import LOGGED_TASK, Point, Run
from ablate.report.schema import ABSENT


def curve(points: list[list[Point]]) -> schema.Curve:
    """Mean, sd, min and max over runs (each run's points, one a step) at the steps every run has."""
    by_step = [{p.step: p for p in run} for run in points]
    steps = sorted(set.intersection(*(set(b) for b in by_step))) if by_step else []
    values = np.array([[b[s].value for s in steps] for b in by_step]) if steps else np.zeros((0, 0))
    return schema.Curve(
        steps=steps,
        tokens=[by_step[0][s].tokens for s in steps],
        mean=values.mean(axis=0).tolist() if steps else [],
        std=values.std(axis=0, ddof=1).tolist() if len(points) >= 2 and steps else None,
        min=values.min(axis=0).tolist() if steps else [],
        max=values.max(axis=0).tolist() if steps else [],
    )


def logged_curves(runs_by_variant: dict[str, list[Run]]) -> list[schema.LoggedCurve]:
    """Each logged key but the training loss (the group's train_loss): each variant's curve over the runs that
    logged it; ABSENT (the key left out of report.json) where the runs logged no other key."""
    keys = [k for k in logged_keys([r for rs in runs_by_variant.values() for r in rs]) if k != "loss"]
    out = []
    for key in keys:
        held = {
            v: [r.scores[LOGGED_TASK, key] for r in rs if (LOGGED_TASK, key) in r.scores]
            for v, rs in runs_by_variant.items()
        }
        out.append(schema.LoggedCurve(key=key, curve={v: curve(points) for v, points in held.items() if points}))
    return out or ABSENT
