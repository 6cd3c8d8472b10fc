"""A grid's cells: one per combination of axis values, its seeds averaged (report["sweep"]["cells"]), the cells
grouped by a context (their values on some axes), and the heatmap of the score over two axes."""

from __future__ import annotations

import numpy as np

from ablate.report.inputs.runs import Run, get_dotted
from ablate.report.stats import describe

LR_AXIS, BATCH_AXIS = "optim.lr", "train.global_batch"


def _short(axis: str) -> str:
    return axis.split(".")[-1]


def label(axes: list[str], values) -> str:
    """axis=value,... by the axes' last names; "all" for no axes."""
    return ",".join(f"{_short(a)}={v}" for a, v in zip(axes, values)) or "all"


def order(value):
    """A sort key that puts numbers first, in value order, then everything else by its text."""
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def final(run: Run, metric: tuple[str, str] | None, at: dict | None = None) -> float | None:
    """The run's score at `at[label]` (the equal-token point the decisions use), else its last."""
    if at and run.label in at:
        return at[run.label].value
    points = run.scores.get(metric) if metric else run.train_loss
    return points[-1].value if points else None


def _summary(values) -> dict:
    v = np.asarray(values, float)
    return {"mean": float(v.mean()), "std": describe.std(v), "min": float(v.min()), "max": float(v.max())}


def grid_cells(runs: list[Run], axes: list[str], metric, at: dict | None = None) -> tuple[list[dict], dict]:
    """One dict per grid cell, in axis order, and {cell values: its runs}."""
    runs_of: dict[tuple, list[Run]] = {}
    for run in runs:
        runs_of.setdefault(tuple(get_dotted(run.config, a) for a in axes), []).append(run)
    cells = []
    for values in sorted(runs_of, key=lambda vs: tuple(order(v) for v in vs)):
        rs = sorted(runs_of[values], key=lambda r: r.seed)
        finals = [final(r, metric, at) for r in rs]
        params = [r.summary.get("params") for r in rs if r.summary and r.summary.get("params")]
        cells.append(
            {
                "values": list(values),
                "label": label(axes, values),
                "seeds": [r.seed for r in rs],
                "finals": finals,
                **_summary(finals),
                "params": float(np.mean(params)) if params else None,
            }
        )
    return cells, runs_of


def group(cells: list[dict], axes: list[str], by: list[str]) -> dict[tuple, list[dict]]:
    """Cells grouped by their values on the axes `by` (the "context"), in cell order."""
    idx = [axes.index(a) for a in by]
    out: dict[tuple, list[dict]] = {}
    for c in cells:
        out.setdefault(tuple(c["values"][i] for i in idx), []).append(c)
    return out


def heatmap(axes: list[str], cells: list[dict], sign: float) -> dict | None:
    """The score over LR (else the first axis) and batch size (else the next), the other axes at the best cell's
    values; None for a grid over one axis."""
    if len(axes) < 2:
        return None
    x = LR_AXIS if LR_AXIS in axes else axes[0]
    y = BATCH_AXIS if BATCH_AXIS in axes and BATCH_AXIS != x else next(a for a in axes if a != x)
    best = min(cells, key=lambda c: sign * c["mean"])
    fixed = {a: best["values"][k] for k, a in enumerate(axes) if a not in (x, y)}  # other axes at the best cell's
    keep = [c for c in cells if all(c["values"][axes.index(a)] == v for a, v in fixed.items())]
    xi, yi = axes.index(x), axes.index(y)
    xs = sorted({c["values"][xi] for c in keep}, key=order)
    ys = sorted({c["values"][yi] for c in keep}, key=order)
    at = {(c["values"][xi], c["values"][yi]): c for c in keep}
    return {
        "x": x,
        "y": y,
        "x_values": xs,
        "y_values": ys,
        "fixed": fixed,
        "mean": [[at[(xv, yv)]["mean"] if (xv, yv) in at else None for xv in xs] for yv in ys],
        "n_seeds": [[len(at[(xv, yv)]["seeds"]) if (xv, yv) in at else 0 for xv in xs] for yv in ys],
        "best": {"label": best["label"], "mean": best["mean"]},
    }
