"""Beside each compute multiplier (estimate.py): a projection along its trend across rungs (only when asked,
labelled an extrapolation), and the seed bootstrap that checks the delta-method interval where there are >= 5
seeds (a percentile interval over resampled whole seeds: a check, never the interval).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable

import numpy as np

from ablate.report.sections.multipliers.baseline_curve import (
    Cell,
    Point,
    check_form,
    fit_curve,
    group_cells,
    reader_for,
)
from ablate.report.sections.multipliers.estimate import MIN_BOOT_SEEDS, extrapolation_note
from ablate.report.sections.multipliers.intervals import LEVEL, t_quantile


def _nearest(cells: list[Cell], flops: float | None) -> Cell:
    return cells[-1] if flops is None else min(cells, key=lambda c: abs(math.log(c.flops / flops)))


def projection(rows: list[dict], target_flops: float, level: float = LEVEL) -> dict:
    """One variant's data multiplier carried along its least squares line in log M vs log compute to
    `target_flops` (rows: one per rung, with log_multiplier and log_se): an extrapolation, labelled so."""
    used = [r for r in rows if r["log_se"] is not None]
    out = {"target_flops": target_flops, "multiplier": None, "interval": None, "extrapolation": True, "note": ""}
    if len({r["rung"] for r in used}) < 2:
        out["note"] = "a projection needs a multiplier with its interval at >= 2 rungs"
        return out
    x = np.log([r["flops"] for r in used])
    y = np.array([r["log_multiplier"] for r in used])
    var = np.array([r["log_se"] ** 2 for r in used])
    xc = x - x.mean()
    # the fitted line at the target is a linear combination of the rungs' log M: its variance follows
    coef = 1 / len(used) + (math.log(target_flops) - x.mean()) * xc / float(xc @ xc)
    estimate, se = float(coef @ y), math.sqrt(float(coef**2 @ var))
    half = t_quantile(level, min(r["df"] for r in used)) * se
    out.update(multiplier=math.exp(estimate), interval=[math.exp(estimate - half), math.exp(estimate + half)])
    span = f"{min(r['flops'] for r in used):.3g} to {max(r['flops'] for r in used):.3g} FLOPs"
    out["note"] = f"extrapolated along the trend from rungs at {span}; no measurement at the target"
    return out


def bootstrap_interval(
    points: Iterable[Point],
    variant: str,
    baseline: str,
    rung: Hashable,
    floor: float | None = None,
    level: float = LEVEL,
    n_boot: int = 400,
    seed: int = 0,
    flops: float | None = None,
) -> dict:
    """Percentile interval of the data multiplier at one rung (the variant's cell nearest `flops`, default its
    largest), resampling whole seeds: a drawn seed brings all its points, baseline's and variant's; each resample
    reads M as the row does (reader_for: the power law, or the local quadratic where its fit fails). None below
    MIN_BOOT_SEEDS seeds."""
    points = [p for p in points if p.rung == rung and p.arm in (variant, baseline)]
    seeds = sorted({p.seed for p in points}, key=str)
    out = {"interval": None, "n_boot": 0, "used": 0, "note": ""}
    if len(seeds) < MIN_BOOT_SEEDS:
        distinct = math.comb(2 * len(seeds) - 1, len(seeds)) if seeds else 0
        out["note"] = (
            f"{len(seeds)} seeds have {distinct} distinct resamples: no bootstrap below {MIN_BOOT_SEEDS} seeds"
        )
        return out
    by_seed = defaultdict(list)
    for p in points:
        by_seed[p.seed].append(p)
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(n_boot):
        drawn = [
            Point(p.arm, p.rung, (k, p.seed), p.flops, p.loss, p.item_var)
            for k, s in enumerate(rng.choice(len(seeds), len(seeds)))
            for p in by_seed[seeds[s]]
        ]
        cells = group_cells(drawn)
        if (baseline, rung) not in cells or (variant, rung) not in cells:
            continue
        # what the row reads M from: the power law, or the local quadratic where the resample's fit fails
        curve = reader_for(check_form(fit_curve(cells[(baseline, rung)], floor=floor), shared=floor is None))
        cell = _nearest(cells[(variant, rung)], flops)
        if not isinstance(curve, str) and extrapolation_note(curve, cell) is None:
            found.append(curve.log_compute_for(cell.mean) - math.log(cell.flops))
    out.update(n_boot=n_boot, used=len(found))
    if len(found) >= 2:
        tail = (1 - level) / 2 * 100
        out["interval"] = [float(math.exp(v)) for v in np.percentile(found, [tail, 100 - tail])]
    if len(found) < n_boot:
        out["note"] = f"{n_boot - len(found)} of {n_boot} resamples gave no multiplier (extrapolated or no fit)"
    return out
