"""Three of the sweep's views from its cells: the score against LR per context with the fitted optimum
(report["sweep"]["lr"]), the optimum's drift along each size axis (report["sweep"]["drift"]), and the best cell per
model size with L(N) = E + A N^-alpha and the decision accuracy of smaller sizes' rankings of the other axes
(report["sweep"]["scale"]). The batch-size view is batch.py."""

from __future__ import annotations

import numpy as np

from ablate.report.options import Options
from ablate.report.sections.sweep import fits
from ablate.report.sections.sweep.cells import LR_AXIS, group, label, order
from ablate.report.stats import describe


def lr_views(axes: list[str], cells: list[dict], lower: bool, opts: Options) -> list[dict]:
    """One view per context (the other axes' values): the score at each LR and the fitted optimum."""
    others = [a for a in axes if a != LR_AXIS]
    k = axes.index(LR_AXIS)
    out = []
    for ctx, cs in group(cells, axes, others).items():
        cs = sorted(cs, key=lambda c: c["values"][k])
        fit = fits.lr_optimum(
            [c["values"][k] for c in cs], [c["finals"] for c in cs], lower, n_boot=opts.bootstrap, seed=opts.seed
        )
        out.append(
            {
                "context": dict(zip(others, ctx)),
                "label": label(others, ctx),
                "lrs": [c["values"][k] for c in cs],
                "n_seeds": [len(c["seeds"]) for c in cs],
                **{s: [c[s] for c in cs] for s in ("mean", "std", "min", "max")},
                "fit": fit,
            }
        )
    return out


# The swept hyperparameters whose optimum the section fits (lr_optimum's quadratic in log10 of the value): the drift
# reads each of them the same way
OPTIMUM_AXES = (LR_AXIS,)


def _numeric(values) -> bool:
    return all(order(v)[0] == 0 and v > 0 for v in values)


def drift_views(axes: list[str], size_axes: list[str], cells: list[dict], lower: bool, opts: Options) -> list[dict]:
    """For each hyperparameter of OPTIMUM_AXES and each numeric size axis, per value of the remaining axes with >= 2
    scales: how the optimum moves with the scale (fits.optimum_drift)."""
    out = []
    for hp in (a for a in OPTIMUM_AXES if a in axes):
        k = axes.index(hp)
        for scale_axis in size_axes:
            j = axes.index(scale_axis)
            if not _numeric({c["values"][j] for c in cells}):
                continue
            others = [a for a in axes if a not in (hp, scale_axis)]
            for ctx, cs in group(cells, axes, others).items():
                by_scale = group(sorted(cs, key=lambda c: c["values"][j]), axes, [scale_axis])
                if len(by_scale) < 2:
                    continue
                cols = [sorted(by_scale[sc], key=lambda c: c["values"][k]) for sc in by_scale]
                fit = fits.optimum_drift(
                    [sc[0] for sc in by_scale],
                    [[c["values"][k] for c in col] for col in cols],
                    [[c["finals"] for c in col] for col in cols],
                    lower,
                    n_boot=opts.bootstrap,
                    seed=opts.seed,
                )
                context = {"hyperparameter": hp, "scale": scale_axis, "context": dict(zip(others, ctx))}
                out.append({**context, "label": label(others, ctx), **fit})
    return out


def _sizes(axes: list[str], size_axes: list[str], cells: list[dict], sign: float) -> list[dict]:
    """The best cell at each model size, smallest first; N from summary.json's params, else a numeric axis value
    (a size with neither is left out)."""
    others = [a for a in axes if a not in size_axes]
    sizes = []
    for ctx, cs in group(cells, axes, size_axes).items():
        params = [c["params"] for c in cs if c["params"]]
        n = float(np.mean(params)) if params else (float(ctx[0]) if len(ctx) == 1 and order(ctx[0])[0] == 0 else None)
        best = min(cs, key=lambda c: sign * c["mean"])
        sizes.append(
            {
                "values": dict(zip(size_axes, ctx)),
                "label": label(size_axes, ctx),
                "params": n,
                "params_from": "summary" if params else "axis value",
                "best": best["label"],
                "mean": best["mean"],
                "finals": best["finals"],
                "cells": {label(others, [c["values"][axes.index(a)] for a in others]): c["mean"] for c in cs},
            }
        )
    return sorted([s for s in sizes if s["params"] is not None], key=lambda s: s["params"])


def _decisions(sizes: list[dict], sign: float) -> list[dict]:
    """Does the order of the other axes' cells at a smaller size hold at the largest? (sizes sharing >= 2 cells)"""
    top = sizes[-1]["cells"]
    out = []
    for s in sizes[:-1]:
        shared = [k for k in top if k in s["cells"]]
        if len(shared) < 2:
            continue
        small, large = [-sign * s["cells"][k] for k in shared], [-sign * top[k] for k in shared]
        out.append(
            {
                "label": s["label"],
                "params": s["params"],
                "cells": shared,
                "decision_accuracy": describe.decision_accuracy(small, large),
                "tau": describe.kendall(small, large),
            }
        )
    return out


def scale_views(
    axes: list[str], size_axes: list[str], cells: list[dict], sign: float, lower: bool, opts: Options
) -> dict:
    """report["sweep"]["scale"]: the sizes, L(N) fitted to losses, the smaller sizes' rankings against the largest."""
    others = [a for a in axes if a not in size_axes]
    sizes = _sizes(axes, size_axes, cells, sign)
    fit, note = None, ""
    if lower:
        fit = fits.power_law(
            [s["params"] for s in sizes],
            [s["mean"] for s in sizes],
            [s["finals"] for s in sizes],
            n_boot=min(opts.bootstrap, fits.MAX_FIT_BOOT),
            seed=opts.seed,
        )
    else:
        note = "L(N) = E + A N^-alpha is fitted to losses only"
    decision = _decisions(sizes, sign) if others and len(sizes) >= 2 else []
    return {"axes": size_axes, "ranked": others, "sizes": sizes, "fit": fit, "decision": decision, "note": note}
