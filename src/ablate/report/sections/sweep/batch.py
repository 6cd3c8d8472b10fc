"""The sweep's batch-size view (report["sweep"]["batch"], one per context): each batch size at its best LR, its
loss curve averaged over seeds, the steps S and tokens E at which it first reaches each target loss, the fits of
those (fits.critical_batch, fits.wsd_batch) beside MiniCPM's rule, and their CIs with seeds resampled."""

from __future__ import annotations

import numpy as np

from ablate.report.inputs.runs import VAL_TASK, Run
from ablate.report.options import Options
from ablate.report.sections.sweep import fits
from ablate.report.sections.sweep.cells import BATCH_AXIS, LR_AXIS, group, label

N_TARGETS = 5
SMOOTH = 5  # training loss is logged per step and noisy: a centred moving average before reading crossings


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


def _targets(curves: list[np.ndarray]) -> list[float]:
    """Losses every batch size starts above and at least two reach: N_TARGETS evenly spaced, the lowest reached by
    the two best batch sizes."""
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


def _in_sequences(fit: dict, keys: tuple[str, ...], seq_len: float) -> dict:
    """The fit with each of `keys` (tokens per step) also in sequences per step, as `<key>_sequences`."""
    return {**fit, **{f"{k}_sequences": fit[k] / seq_len if fit[k] is not None else None for k in keys}}


def _fit_target(row: dict, seq_len: float) -> dict:
    """One target's crossings with their fits: the hyperbola, the WSD E(S), the grid's own bound on B_min, MiniCPM."""
    tps, s = [p["tokens_per_step"] for p in row["points"]], [p["steps"] for p in row["points"]]
    reached = sorted(p["batch"] for p in row["points"])
    below = [b for b in row["not_reached"] if reached and b < reached[0]]
    mini = fits.minicpm_batch_tokens(row["loss"])
    return {
        **row,
        "critical": _in_sequences(fits.critical_batch(tps, s), ("b_crit",), seq_len),
        "wsd": _in_sequences(fits.wsd_batch(tps, s), ("b_opt", "b_min", "bound_b"), seq_len),
        # the grid's own answer to B_min: the smallest batch that got there, above the largest smaller one that did not
        "b_min_observed": {"at_most": reached[0] if reached else None, "above": max(below) if below else None},
        "minicpm": {"tokens": mini, "sequences": mini / seq_len},
    }


def _bootstrap(
    batches: list, seeds: list[tuple], targets: list[float], width: int, opts: Options
) -> tuple[int, list[dict]]:
    """Seeds resampled at each batch size, the mean curves rebuilt, the crossings read again and refitted: the
    replicates and, per target, the B_crit and B_opt of those that gave one."""
    rng = np.random.default_rng(opts.seed)
    n_boot = min(opts.bootstrap, fits.MAX_FIT_BOOT)
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
    return n_boot, found


def _with_ci(fit: dict, samples: list[float], n_boot: int, seq_len: float) -> dict:
    ci = fits.percentile_ci(samples)
    return {
        **fit,
        "ci": ci,
        "ci_sequences": [v / seq_len for v in ci] if ci else None,
        "ci_share": len(samples) / n_boot,
    }


def _seq_len(chosen: list[tuple], seeds: list[tuple]) -> float:
    """Tokens per sequence: the runs' data.seq_len, else tokens / steps / batch at their last logged point."""
    lengths = [
        r.config.get("data", {}).get("seq_len") or t[-1] / s[-1] / b
        for (b, _, rs), (s, t, _) in zip(chosen, seeds)
        for r in rs
    ]
    return float(np.median(lengths or [1]))


def _curve_entries(batches: list, mean_curves: list[tuple], seeds: list[tuple]) -> list[dict]:
    return [
        {
            "batch": b,
            "steps": s.tolist(),
            "tokens": t.tolist(),
            "mean": y.tolist(),
            "min": m.min(axis=0).tolist(),
            "max": m.max(axis=0).tolist(),
        }
        for b, (s, t, y), (_, _, m) in zip(batches, mean_curves, seeds)
    ]


def _batch_context(name: str, context: dict, chosen: list[tuple], kind: str, opts: Options) -> dict:
    """chosen: [(batch size, best cell, its runs)] for one context, smallest batch first."""
    all_seeds = [_seed_curves(rs, kind) for _, _, rs in chosen]
    short = [c["label"] for (_, c, _), sd in zip(chosen, all_seeds) if len(sd[0]) < 2]  # too few points to cross
    kept = [(ch, sd) for ch, sd in zip(chosen, all_seeds) if len(sd[0]) >= 2]
    chosen, seeds = [ch for ch, _ in kept], [sd for _, sd in kept]
    batches = [b for b, _, _ in chosen]
    width = SMOOTH if kind == "train_loss" else 1
    mean_curves = [(s, t, _smooth(m.mean(axis=0), width)) for s, t, m in seeds]
    seq_len = _seq_len(chosen, seeds)
    out = {
        "context": context,
        "label": name,
        "curve": kind,
        "seq_len": seq_len,
        "batches": batches,
        "cells": [c["label"] for _, c, _ in chosen],
        "short_curves": short,
        "curves": _curve_entries(batches, mean_curves, seeds),
        "targets": [],
        "n_boot": 0,
        "note": "",
    }
    if len(batches) < 2:
        return {**out, "note": "needs >= 2 batch sizes with >= 2 logged points in common over seeds"}
    targets = _targets([y for _, _, y in mean_curves])
    if not targets:
        return {**out, "note": "no loss that every batch size starts above is reached by two of them"}
    rows = [_fit_target(row, seq_len) for row in _crossings(batches, mean_curves, targets)]
    if not any(r["critical"]["status"] == "fit" or r["wsd"]["status"] == "vertex" for r in rows):
        return {**out, "targets": rows}  # nothing to put a CI on
    if min(m.shape[0] for _, _, m in seeds) < 2:
        return {**out, "targets": rows, "note": "CIs of B_crit and B_opt: need >= 2 seeds at every batch size"}
    n_boot, found = _bootstrap(batches, seeds, targets, width, opts)
    rows = [
        {
            **row,
            "critical": _with_ci(row["critical"], f["b_crit"], n_boot, seq_len),
            "wsd": _with_ci(row["wsd"], f["b_opt"], n_boot, seq_len),
        }
        for row, f in zip(rows, found)
    ]
    return {**out, "targets": rows, "n_boot": n_boot}


def batch_views(axes: list[str], cells: list[dict], runs_of: dict, sign: float, opts: Options) -> list[dict]:
    """One view per context (the axes other than batch size and LR), each batch size at its best LR."""
    ctx_axes = [a for a in axes if a not in (BATCH_AXIS, LR_AXIS)]
    kb = axes.index(BATCH_AXIS)
    out = []
    for ctx, cs in group(cells, axes, ctx_axes).items():
        by_batch: dict = {}
        for c in cs:  # each batch size at its best LR (the cell with the best final score)
            b = c["values"][kb]
            if b not in by_batch or sign * c["mean"] < sign * by_batch[b]["mean"]:
                by_batch[b] = c
        chosen = [(b, c, runs_of[tuple(c["values"])]) for b, c in sorted(by_batch.items(), key=lambda kv: kv[0])]
        runs = [r for _, _, rs in chosen for r in rs]
        kind = "val_loss" if all(len(r.scores.get((VAL_TASK, "loss"), [])) >= 3 for r in runs) else "train_loss"
        out.append(_batch_context(label(ctx_axes, ctx), dict(zip(ctx_axes, ctx)), chosen, kind, opts))
    return out
