"""report["sweep"]: runs built by grid() (config.json "axes") laid out on their axes.

A grid cell is one combination of axis values; its seeds are averaged. From the cells (cells.py):
- points and a heatmap of the primary metric (final val/loss, else final training loss) over two axes;
- the metric against LR per value of the other axes, and the fitted optimum LR (views.py, fits.lr_optimum);
- with a batch-size axis (train.global_batch): steps S and tokens E to reach target losses, read off the loss
  curves of each batch size at its best LR, and the fits of McCandlish's hyperbola (B_crit) and the WSD-revised E(S)
  of seed 001 (B_opt, B_min), beside MiniCPM's rule (batch.py);
- with a model-size axis (model.d_model, model.n_layers, model.ffn_hidden or a --scale field): L(N) = E + A N^-alpha
  over parameters (summary.json "params") and the decision accuracy of smaller sizes' rankings of the other axes;
  with an LR axis too, how the optimum LR moves with the size (views.drift_views, fits.optimum_drift).
Every number the text and plots show is in the returned dict; a fit that cannot be made says why in "note".
"""

from __future__ import annotations

from collections import Counter

from ablate.report.inputs.match import final_points
from ablate.report.inputs.runs import VAL_TASK, ReportError, Run
from ablate.report.options import Options
from ablate.report.schema import Sweep
from ablate.report.sections.sweep.batch import batch_views
from ablate.report.sections.sweep.cells import BATCH_AXIS, LR_AXIS, final, grid_cells, heatmap
from ablate.report.sections.sweep.views import drift_views, lr_views, scale_views

SIZE_FIELDS = ("model.d_model", "model.n_layers", "model.ffn_hidden")


def _selected(gridded: list[Run]) -> tuple[list[str], list[Run], list[str]]:
    """The axes most runs were built on, their finished runs, and a note for each run left out."""
    axes = list(Counter(tuple(r.config["axes"]) for r in gridded).most_common(1)[0][0])
    notes = []
    other = [r.label for r in gridded if list(r.config["axes"]) != axes]
    if other:
        notes.append(f"left out, built on other axes than {', '.join(axes)}: {', '.join(other)}")
    mine = [r for r in gridded if list(r.config["axes"]) == axes]
    unfinished = [r.label for r in mine if r.status != "finished"]
    if unfinished:
        notes.append(f"left out, not finished: {', '.join(unfinished)}")
    return axes, [r for r in mine if r.status == "finished"], notes


def _scored(finished: list[Run]) -> tuple[tuple[str, str] | None, list[Run], list[str]]:
    """What the cells are scored by (val/loss, else None: the training loss), the runs that have it, the notes."""
    metric = (VAL_TASK, "loss")
    notes = []
    if not any(r.scores.get(metric) for r in finished):
        metric = None
        notes.append("no run logged val/loss: the sweep views use the final training loss")
    missing = [r.label for r in finished if final(r, metric) is None]
    if missing:
        notes.append(f"left out, no {'val/loss' if metric else 'training loss'}: {', '.join(missing)}")
    return metric, [r for r in finished if final(r, metric) is not None], notes


def _read_at(scored: list[Run], metric) -> tuple[dict | None, str, list[str]]:
    """Where each run's score is read: as the decisions do, every run at the largest token count all of them
    reached (None: at its end), the source in words, and a note when that is not each run's end."""
    source = "final val/loss" if metric else "final loss"
    if not (metric and scored):
        return None, source, []
    at, tokens, at_last = final_points(scored, metric)
    if not tokens or at_last:
        return at, source, []
    note = (
        f"runs differ in tokens per step: every cell is read at {tokens:,} tokens (equal tokens), not at each run's end"
    )
    return at, f"val/loss at {tokens:,} tokens, the most every run reached (equal tokens)", [note]


def _views(axes: list[str], cells: list[dict], runs_of: dict, opts: Options) -> tuple[dict, list[str]]:
    """The heatmap, LR, batch-size and model-size views the axes allow, and a note for each they do not."""
    sign, lower = 1.0, True  # the sweep metric is a loss: lower is better
    notes = []
    views = {"heatmap": heatmap(axes, cells, sign), "lr": None, "batch": None, "scale": None, "drift": None}
    if views["heatmap"] is None:
        notes.append("heatmap: needs a grid over >= 2 axes")
    if LR_AXIS in axes:
        views["lr"] = lr_views(axes, cells, lower, opts)
    else:
        notes.append(f"optimum LR: needs an {LR_AXIS} axis")
    if BATCH_AXIS in axes:
        views["batch"] = batch_views(axes, cells, runs_of, sign, opts)
    else:
        notes.append(f"B_crit, B_opt, B_min: need a {BATCH_AXIS} axis")
    size_axes = [a for a in axes if a in SIZE_FIELDS or a in opts.scale]
    if size_axes:
        views["scale"] = scale_views(axes, size_axes, cells, sign, lower, opts)
        if LR_AXIS in axes:
            views["drift"] = drift_views(axes, size_axes, cells, lower, opts)
    else:
        notes.append(f"L(N) power law: needs a model-size axis ({', '.join(SIZE_FIELDS)} or a --scale field)")
    return views, notes


def sweep_section(runs: list[Run], opts: Options) -> Sweep | None:
    """report["sweep"]; None when no run was built by grid(). The views work in dicts (views.py, fits.py, batch.py);
    what leaves the section is its record."""
    gridded = [r for r in runs if r.config.get("axes")]
    if not gridded:
        return None
    axes, finished, left_out = _selected(gridded)
    metric, scored, unscored = _scored(finished)
    at, source, read = _read_at(scored, metric)
    notes = left_out + unscored + read
    try:
        cells, runs_of = grid_cells(scored, axes, metric, at)
    except ReportError as exc:
        return Sweep(axes=axes, metric=None, cells=[], notes=notes + [f"axes unreadable: {exc}"])
    task = VAL_TASK if metric else "train_loss"
    out = {
        "axes": axes,
        "metric": {"task": task, "metric": "loss", "direction": "lower", "source": source},
        "cells": cells,
        "heatmap": None,
        "lr": None,
        "batch": None,
        "scale": None,
        "drift": None,
        "notes": notes,
    }
    if not cells:
        return Sweep.from_json({**out, "notes": notes + ["no finished grid run to lay out"]})
    views, why_not = _views(axes, cells, runs_of, opts)
    return Sweep.from_json({**out, **views, "notes": notes + why_not})
