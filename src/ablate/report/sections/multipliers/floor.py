"""The floor E of the baseline's curve, where it is not fitted at each rung on its own (estimate.py).

Identifiability. With fewer than 4 baseline compute points E is not identifiable (3 points and 3 parameters fit
exactly, any E): E must be pinned (a given value, or "shared": one E profiled across the rungs' pinned fits, its
estimation error then carried into every interval by the joint linearization, carry_shared_e). The
multiplier is then recomputed over a stated E range (default 0 to 0.8 of the lowest baseline loss: any floor a
reader would believe, not a neighbourhood of the fitted one) and flagged when it moves more than its interval's
half-width.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np
from scipy import optimize

from ablate.report.sections.multipliers.baseline_curve import EDGE_SHARE, Cell, fit_curve
from ablate.report.sections.multipliers.intervals import t_quantile

E_RANGE = (0.0, 0.8)  # the sensitivity check's default E range, as shares of the baseline's lowest loss


def sensitivity(base: list[Cell], variant: Cell, est: dict, floor_range, level: float) -> dict:
    """M with E pinned across a range a reader would believe (default 0 to 0.8 of the baseline's lowest loss; its
    ends and middle): M at the ends, its least and largest value, flagged where any moves log M more than the
    interval's half-width or gives no number there."""
    if floor_range is None:  # in units of the losses, not of E: an E found at 0 still gets a range
        lowest = min(c.mean for c in base)
        floor_range = (E_RANGE[0] * lowest, E_RANGE[1] * lowest)
    low, high = floor_range
    at = []
    for e in np.linspace(low, high, 3):
        curve = fit_curve(base, floor=float(e))
        m = None if isinstance(curve, str) else math.exp(curve.log_compute_for(variant.mean)) / variant.flops
        at.append(m if m is not None and 0 < m < math.inf else None)
    half = None if est["var"] is None else t_quantile(level, est["df"]) * math.sqrt(est["var"])
    moves = [abs(math.log(m) - est["log_m"]) for m in at if m is not None]
    flagged = None in at or (half is not None and any(mv > half for mv in moves))
    found = [m for m in at if m is not None]
    return {
        "E_range": [low, high],
        "multipliers": [at[0], at[-1]],
        "spread": [min(found), max(found)] if found else None,
        "flagged": bool(flagged),
    }


def shared_floor(curves_cells: dict[Hashable, list[Cell]], grid: int = 40) -> float | None:
    """One E for every rung: the value below the lowest baseline loss that minimizes the rungs' summed squared
    residuals with E pinned (each rung keeps its own A and alpha): a grid, then a bounded search between the best
    grid value's neighbours. None if no rung can be fitted."""
    lowest = min(c.mean for cells in curves_cells.values() for c in cells)

    def sse(e: float) -> float:
        total = 0.0
        for cells in curves_cells.values():
            curve = fit_curve(cells, floor=float(e))
            if isinstance(curve, str):
                return math.inf
            total += float(((curve.loss_at([c.flops for c in cells]) - [c.mean for c in cells]) ** 2).sum())
        return total

    floors = np.sort(lowest * (1 - np.geomspace(1e-3, 1, grid)))
    found = [sse(e) for e in floors]
    k = int(np.argmin(found))
    if not math.isfinite(found[k]):
        return None
    low, high = floors[max(k - 1, 0)], floors[min(k + 1, grid - 1)]
    best = optimize.minimize_scalar(sse, bounds=(low, high), method="bounded", options={"xatol": 1e-6})
    return float(best.x) if best.fun <= found[k] else float(floors[k])


def carry_shared_e(curves: dict) -> bool:
    """With one E fitted across the rungs (shared_floor), every rung's (E, log a, alpha) responds to every rung's
    points: the joint least-squares Jacobian's pseudo-inverse (E one column, each rung its own two) replaces each
    curve's own, so E's estimation error is in every interval. Not where E came out at the edge of its search (0):
    there it is a bound, not a fit, and stays held (the sensitivity check says what it moves). Returns whether it
    was carried."""
    fitted = [c for c in curves.values() if not isinstance(c, str)]
    if len(fitted) < 2 or len(fitted) != len(curves):
        return False
    if fitted[0].E <= EDGE_SHARE * min(cell.mean for c in fitted for cell in c.cells):
        return False
    basis = [cell for c in fitted for cell in c.cells]
    jac = np.zeros((len(basis), 1 + 2 * len(fitted)))
    jac[:, 0] = 1.0
    start = 0
    for k, c in enumerate(fitted):
        u = np.log(np.array([cell.flops for cell in c.cells]) / c.c0)
        core = np.exp(c.log_a - c.alpha * u)
        jac[start : start + len(u), 1 + 2 * k] = core
        jac[start : start + len(u), 2 + 2 * k] = -u * core
        start += len(u)
    response = np.linalg.pinv(jac)  # (1 + 2 rungs, points): the joint fit's linear response to the point means
    for k, c in enumerate(fitted):
        c.dtheta, c.basis = response[[0, 1 + 2 * k, 2 + 2 * k]], basis
    return True
