"""Sweep views: runs built by grid() (config.json "axes") laid out on their axes, as report["sweep"].

A grid cell is one combination of axis values; its seeds are averaged. From the cells:
- points and a heatmap of the primary metric (final val/loss, else final training loss) over two axes;
- the metric against LR per value of the other axes, and the fitted optimum LR (fits.lr_optimum);
- with a batch-size axis (train.global_batch): steps S and tokens E to reach target losses, read off the loss
  curves of each batch size at its best LR, and the fits of McCandlish's hyperbola (B_crit) and the WSD-revised E(S)
  of seed 001 (B_opt, B_min), beside MiniCPM's rule;
- with a model-size axis (model.d_model, model.n_layers, model.ffn_hidden or a --scale field): L(N) = E + A N^-alpha
  over parameters (summary.json "params") and the decision accuracy of smaller sizes' rankings of the other axes.
Every number the text and plots show is in the returned dict; a fit that cannot be made says why in "note".
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ablate.report.grid import fits
from ablate.report.stats import stats
from ablate.report.inputs.match import final_points
from ablate.report.inputs.runs import VAL_TASK, ReportError, Run, get_dotted

LR_AXIS, BATCH_AXIS = "optim.lr", "train.global_batch"
SIZE_FIELDS = ("model.d_model", "model.n_layers", "model.ffn_hidden")
N_TARGETS = 5
MAX_FIT_BOOT = 200  # replicates that re-read loss curves or refit by least squares cost more than a mean
SMOOTH = 5  # training loss is logged per step and noisy: a centred moving average before reading crossings


def _short(axis: str) -> str:
    return axis.split(".")[-1]


def _label(axes: list[str], values) -> str:
    return ",".join(f"{_short(a)}={v}" for a, v in zip(axes, values)) or "all"


def _order(value):
    return (0, value, "") if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, 0, str(value))


def _final(run: Run, metric: tuple[str, str] | None, at: dict | None = None) -> float | None:
    """The run's score at `at[label]` (the equal-token point the decisions use), else its last."""
    if at and run.label in at:
        return at[run.label].value
    points = run.scores.get(metric) if metric else run.train_loss
    return points[-1].value if points else None


def _summary(values) -> dict:
    v = np.asarray(values, float)
    return {"mean": float(v.mean()), "std": stats.std(v), "min": float(v.min()), "max": float(v.max())}


def _cells(runs: list[Run], axes: list[str], metric, at: dict | None = None) -> tuple[list[dict], dict]:
    """One dict per grid cell, in axis order, and {cell values: its runs}."""
    runs_of: dict[tuple, list[Run]] = {}
    for run in runs:
        runs_of.setdefault(tuple(get_dotted(run.config, a) for a in axes), []).append(run)
    cells = []
    for values in sorted(runs_of, key=lambda vs: tuple(_order(v) for v in vs)):
        rs = sorted(runs_of[values], key=lambda r: r.seed)
        finals = [_final(r, metric, at) for r in rs]
        params = [r.summary.get("params") for r in rs if r.summary and r.summary.get("params")]
        cells.append(
            {
                "values": list(values),
                "label": _label(axes, values),
                "seeds": [r.seed for r in rs],
                "finals": finals,
                **_summary(finals),
                "params": float(np.mean(params)) if params else None,
            }
        )
    return cells, runs_of


def _group(cells: list[dict], axes: list[str], by: list[str]) -> dict[tuple, list[dict]]:
    """Cells grouped by their values on the axes `by` (the "context"), in cell order."""
    idx = [axes.index(a) for a in by]
    out: dict[tuple, list[dict]] = {}
    for c in cells:
        out.setdefault(tuple(c["values"][i] for i in idx), []).append(c)
    return out


def _heatmap(axes: list[str], cells: list[dict], sign: float) -> dict | None:
    if len(axes) < 2:
        return None
    x = LR_AXIS if LR_AXIS in axes else axes[0]
    y = BATCH_AXIS if BATCH_AXIS in axes and BATCH_AXIS != x else next(a for a in axes if a != x)
    best = min(cells, key=lambda c: sign * c["mean"])
    fixed = {a: best["values"][k] for k, a in enumerate(axes) if a not in (x, y)}  # other axes at the best cell's
    keep = [c for c in cells if all(c["values"][axes.index(a)] == v for a, v in fixed.items())]
    xi, yi = axes.index(x), axes.index(y)
    xs = sorted({c["values"][xi] for c in keep}, key=_order)
    ys = sorted({c["values"][yi] for c in keep}, key=_order)
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


def _lr_views(axes: list[str], cells: list[dict], lower: bool, opts) -> list[dict]:
    others = [a for a in axes if a != LR_AXIS]
    k = axes.index(LR_AXIS)
    out = []
    for ctx, group in _group(cells, axes, others).items():
        group = sorted(group, key=lambda c: c["values"][k])
        fit = fits.lr_optimum(
            [c["values"][k] for c in group], [c["finals"] for c in group], lower, n_boot=opts.bootstrap, seed=opts.seed
        )
        out.append(
            {
                "context": dict(zip(others, ctx)),
                "label": _label(others, ctx),
                "lrs": [c["values"][k] for c in group],
                "n_seeds": [len(c["seeds"]) for c in group],
                **{s: [c[s] for c in group] for s in ("mean", "std", "min", "max")},
                "fit": fit,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------------------------
# batch size: S and E to reach target losses


def _seed_curves(runs: list[Run], kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps, tokens and a (seeds, steps) loss matrix at the steps every seed logged."""
    points = [r.scores.get((VAL_TASK, "loss"), []) if kind == "val_loss" else r.train_loss for r in runs]
    by_step = [{p.step: p for p in ps} for ps in points]
    steps = sorted(set.intersection(*(set(b) for b in by_step)))
    tokens = np.array([by_step[0][s].tokens for s in steps], float)
    return np.array(steps, float), tokens, np.array([[b[s].value for s in steps] for b in by_step])


def _smooth(y: np.ndarray, width: int) -> np.ndarray:
    if width <= 1 or len(y) < width:
        return y
    k = width // 2
    return np.array([y[max(0, i - k) : i + k + 1].mean() for i in range(len(y))])


def _reach(steps: np.ndarray, tokens: np.ndarray, loss: np.ndarray, target: float) -> tuple[float, float] | None:
    """(S, E) where the curve first reaches `target`, interpolated between the checkpoints around it; None when
    never reached or already at the first checkpoint (how long it took is then unknown)."""
    hit = np.nonzero(loss <= target)[0]
    if not len(hit) or hit[0] == 0:
        return None
    j = hit[0]
    f = (loss[j - 1] - target) / (loss[j - 1] - loss[j])
    return (float(steps[j - 1] + f * (steps[j] - steps[j - 1])), float(tokens[j - 1] + f * (tokens[j] - tokens[j - 1])))


def _targets(curves: list[np.ndarray], opts) -> list[float]:
    """Losses every batch size starts above and at least two reach: N_TARGETS evenly spaced, the lowest reached by
    the two best batch sizes (Options.sweep_targets, when set, gives them instead)."""
    given = getattr(opts, "sweep_targets", None)
    if given:
        return sorted((float(t) for t in given), reverse=True)
    hi = min(c[0] for c in curves)
    lo = sorted(c.min() for c in curves)[1]
    return [float(t) for t in np.linspace(hi, lo, N_TARGETS + 1)[1:]] if lo < hi else []


def _crossings(batches, curves, targets) -> list[dict]:
    """Per target: the (S, E) of each batch size that reached it, and the batch sizes that did not."""
    out = []
    for t in targets:
        points, missed = [], []
        for b, (steps, tokens, loss) in zip(batches, curves):
            hit = _reach(steps, tokens, loss, t)
            if hit is None:
                missed.append(b)
            else:
                points.append({"batch": b, "tokens_per_step": hit[1] / hit[0], "steps": hit[0], "tokens": hit[1]})
        out.append({"loss": t, "points": points, "not_reached": missed})
    return out


def _fit_target(row: dict, seq_len: float) -> None:
    tps, s = [p["tokens_per_step"] for p in row["points"]], [p["steps"] for p in row["points"]]
    row["critical"] = fits.critical_batch(tps, s)
    row["wsd"] = fits.wsd_batch(tps, s)
    reached = sorted(p["batch"] for p in row["points"])
    below = [b for b in row["not_reached"] if reached and b < reached[0]]
    # the grid's own answer to B_min: the smallest batch that got there, above the largest smaller one that did not
    row["b_min_observed"] = {"at_most": reached[0] if reached else None, "above": max(below) if below else None}
    mini = fits.minicpm_batch_tokens(row["loss"])
    row["minicpm"] = {"tokens": mini, "sequences": mini / seq_len}
    for fit, keys in ((row["critical"], ("b_crit",)), (row["wsd"], ("b_opt", "b_min", "bound_b"))):
        for k in keys:
            fit[f"{k}_sequences"] = fit[k] / seq_len if fit[k] is not None else None


def _batch_context(label: str, context: dict, chosen: list[tuple], kind: str, opts) -> dict:
    """chosen: [(batch size, best cell, its runs)] for one context, smallest batch first."""
    seeds = [_seed_curves(rs, kind) for _, _, rs in chosen]
    short = [c["label"] for (_, c, _), sd in zip(chosen, seeds) if len(sd[0]) < 2]  # too few points to cross
    kept = [(ch, sd) for ch, sd in zip(chosen, seeds) if len(sd[0]) >= 2]
    chosen, seeds = [ch for ch, _ in kept], [sd for _, sd in kept]
    batches = [b for b, _, _ in chosen]
    width = SMOOTH if kind == "train_loss" else 1
    mean_curves = [(s, t, _smooth(m.mean(axis=0), width)) for s, t, m in seeds]
    seq_len = float(
        np.median(
            [
                r.config.get("data", {}).get("seq_len") or t[-1] / s[-1] / b
                for (b, _, rs), (s, t, _) in zip(chosen, seeds)
                for r in rs
            ]
            or [1]
        )
    )
    out = {
        "context": context,
        "label": label,
        "curve": kind,
        "seq_len": seq_len,
        "batches": batches,
        "cells": [c["label"] for _, c, _ in chosen],
        "short_curves": short,
        "curves": [
            {
                "batch": b,
                "steps": s.tolist(),
                "tokens": t.tolist(),
                "mean": y.tolist(),
                "min": m.min(axis=0).tolist(),
                "max": m.max(axis=0).tolist(),
            }
            for b, (s, t, y), (_, _, m) in zip(batches, mean_curves, seeds)
        ],
        "targets": [],
        "n_boot": 0,
        "note": "",
    }
    targets = _targets([y for _, _, y in mean_curves], opts) if len(batches) >= 2 else []
    if not targets:
        out["note"] = (
            "needs >= 2 batch sizes with >= 2 logged points in common over seeds"
            if len(batches) < 2
            else "no loss that every batch size starts above is reached by two of them"
        )
        return out
    out["targets"] = _crossings(batches, mean_curves, targets)
    for row in out["targets"]:
        _fit_target(row, seq_len)
    if not any(r["critical"]["status"] == "fit" or r["wsd"]["status"] == "vertex" for r in out["targets"]):
        return out  # nothing to put a CI on
    if min(m.shape[0] for _, _, m in seeds) < 2:
        out["note"] = "CIs of B_crit and B_opt: need >= 2 seeds at every batch size"
        return out
    # bootstrap: resample seeds at each batch size, rebuild the mean curves, read the crossings again, refit
    rng = np.random.default_rng(opts.seed)
    n_boot = min(opts.bootstrap, MAX_FIT_BOOT)
    found = [{"b_crit": [], "b_opt": []} for _ in targets]
    for _ in range(n_boot):
        curves = [(s, t, _smooth(m[rng.integers(0, len(m), len(m))].mean(axis=0), width)) for s, t, m in seeds]
        for k, row in enumerate(_crossings(batches, curves, targets)):
            tps, st = [p["tokens_per_step"] for p in row["points"]], [p["steps"] for p in row["points"]]
            crit, wsd = fits.critical_batch(tps, st), fits.wsd_batch(tps, st)
            if crit["status"] == "fit":
                found[k]["b_crit"].append(crit["b_crit"])
            if wsd["status"] == "vertex":
                found[k]["b_opt"].append(wsd["b_opt"])
    out["n_boot"] = n_boot
    for row, f in zip(out["targets"], found):
        for key, fit in (("b_crit", row["critical"]), ("b_opt", row["wsd"])):
            ci = fits.percentile_ci(f[key])
            fit["ci"], fit["ci_sequences"] = ci, [v / seq_len for v in ci] if ci else None
            fit["ci_share"] = len(f[key]) / n_boot
    return out


def _batch_views(axes: list[str], cells: list[dict], runs_of: dict, sign: float, opts) -> list[dict]:
    ctx_axes = [a for a in axes if a not in (BATCH_AXIS, LR_AXIS)]
    kb = axes.index(BATCH_AXIS)
    out = []
    for ctx, group in _group(cells, axes, ctx_axes).items():
        by_batch: dict = {}
        for c in group:  # each batch size at its best LR (the cell with the best final score)
            b = c["values"][kb]
            if b not in by_batch or sign * c["mean"] < sign * by_batch[b]["mean"]:
                by_batch[b] = c
        chosen = [(b, c, runs_of[tuple(c["values"])]) for b, c in sorted(by_batch.items(), key=lambda kv: kv[0])]
        runs = [r for _, _, rs in chosen for r in rs]
        kind = "val_loss" if all(len(r.scores.get((VAL_TASK, "loss"), [])) >= 3 for r in runs) else "train_loss"
        out.append(_batch_context(_label(ctx_axes, ctx), dict(zip(ctx_axes, ctx)), chosen, kind, opts))
    return out


# ---------------------------------------------------------------------------------------------------------------
# model size


def _scale_views(axes: list[str], size_axes: list[str], cells: list[dict], sign: float, lower: bool, opts) -> dict:
    others = [a for a in axes if a not in size_axes]
    sizes = []
    for ctx, group in _group(cells, axes, size_axes).items():
        params = [c["params"] for c in group if c["params"]]
        n = float(np.mean(params)) if params else (float(ctx[0]) if len(ctx) == 1 and _order(ctx[0])[0] == 0 else None)
        best = min(group, key=lambda c: sign * c["mean"])
        sizes.append(
            {
                "values": dict(zip(size_axes, ctx)),
                "label": _label(size_axes, ctx),
                "params": n,
                "params_from": "summary" if params else "axis value",
                "best": best["label"],
                "mean": best["mean"],
                "finals": best["finals"],
                "cells": {_label(others, [c["values"][axes.index(a)] for a in others]): c["mean"] for c in group},
            }
        )
    sizes = sorted([s for s in sizes if s["params"] is not None], key=lambda s: s["params"])
    out = {"axes": size_axes, "ranked": others, "sizes": sizes, "fit": None, "decision": [], "note": ""}
    if lower:
        out["fit"] = fits.power_law(
            [s["params"] for s in sizes],
            [s["mean"] for s in sizes],
            [s["finals"] for s in sizes],
            n_boot=min(opts.bootstrap, MAX_FIT_BOOT),
            seed=opts.seed,
        )
    else:
        out["note"] = "L(N) = E + A N^-alpha is fitted to losses only"
    if others and len(sizes) >= 2:  # does the order of the other axes' cells at a small size hold at the largest?
        top = sizes[-1]["cells"]
        for s in sizes[:-1]:
            shared = [k for k in top if k in s["cells"]]
            if len(shared) < 2:
                continue
            small, large = [-sign * s["cells"][k] for k in shared], [-sign * top[k] for k in shared]
            out["decision"].append(
                {
                    "label": s["label"],
                    "params": s["params"],
                    "cells": shared,
                    "decision_accuracy": stats.decision_accuracy(small, large),
                    "tau": stats.kendall(small, large),
                }
            )
    return out


def analyze_sweep(runs: list[Run], opts) -> dict | None:
    """report["sweep"]; None when no run was built by grid()."""
    gridded = [r for r in runs if r.config.get("axes")]
    if not gridded:
        return None
    axes = list(Counter(tuple(r.config["axes"]) for r in gridded).most_common(1)[0][0])
    notes = []
    other = [r.label for r in gridded if list(r.config["axes"]) != axes]
    if other:
        notes.append(f"left out, built on other axes than {', '.join(axes)}: {', '.join(other)}")
    mine = [r for r in gridded if list(r.config["axes"]) == axes]
    unfinished = [r.label for r in mine if r.status != "finished"]
    if unfinished:
        notes.append(f"left out, not finished: {', '.join(unfinished)}")
    finished = [r for r in mine if r.status == "finished"]
    metric = (VAL_TASK, "loss")
    if not any(r.scores.get(metric) for r in finished):
        metric = None
        notes.append("no run logged val/loss: the sweep views use the final training loss")
    missing = [r.label for r in finished if _final(r, metric) is None]
    if missing:
        notes.append(f"left out, no {'val/loss' if metric else 'training loss'}: {', '.join(missing)}")
    scored = [r for r in finished if _final(r, metric) is not None]
    at, source = None, "final val/loss" if metric else "final loss"
    if metric and scored:  # as the decisions do: every run at the largest token count all of them reached
        at, tokens, at_last = final_points(scored, metric)
        if tokens and not at_last:
            source = f"val/loss at {tokens:,} tokens, the most every run reached (equal tokens)"
            notes.append(
                f"runs differ in tokens per step: every cell is read at {tokens:,} tokens (equal tokens), "
                f"not at each run's end"
            )
    try:
        cells, runs_of = _cells(scored, axes, metric, at)
    except ReportError as exc:
        return {"axes": axes, "metric": None, "cells": [], "notes": notes + [f"axes unreadable: {exc}"]}
    out = {
        "axes": axes,
        "metric": {
            "task": VAL_TASK if metric else "train_loss",
            "metric": "loss",
            "direction": "lower",
            "source": source,
        },
        "cells": cells,
        "heatmap": None,
        "lr": None,
        "batch": None,
        "scale": None,
        "notes": notes,
    }
    if not cells:
        notes.append("no finished grid run to lay out")
        return out
    sign, lower = 1.0, True  # the sweep metric is a loss: lower is better
    out["heatmap"] = _heatmap(axes, cells, sign)
    if out["heatmap"] is None:
        notes.append("heatmap: needs a grid over >= 2 axes")
    if LR_AXIS in axes:
        out["lr"] = _lr_views(axes, cells, lower, opts)
    else:
        notes.append(f"optimum LR: needs an {LR_AXIS} axis")
    if BATCH_AXIS in axes:
        out["batch"] = _batch_views(axes, cells, runs_of, sign, opts)
    else:
        notes.append(f"B_crit, B_opt, B_min: need a {BATCH_AXIS} axis")
    size_axes = [a for a in axes if a in SIZE_FIELDS or a in (getattr(opts, "scale", None) or [])]
    if size_axes:
        out["scale"] = _scale_views(axes, size_axes, cells, sign, lower, opts)
    else:
        notes.append(f"L(N) power law: needs a model-size axis ({', '.join(SIZE_FIELDS)} or a --scale field)")
    return out
