"""L(N) = E + A N^-alpha fitted by least squares on L: the sweep's loss against model size
(sections/sweep/fits.power_law) and the multipliers' baseline loss against compute (sections/multipliers/
baseline_curve.py, E pinned there)."""

from __future__ import annotations

import numpy as np
from scipy import optimize


def _power_law_profile(n: np.ndarray, loss: np.ndarray) -> np.ndarray:
    """(E, log A, alpha) by profiling E on a grid below min(loss), with a log-log line fit at each E."""
    logn = np.log(n)
    floors = loss.min() * (1 - np.geomspace(1e-4, 1, 400))
    y = np.log(loss[None, :] - floors[:, None])
    xc = logn - logn.mean()
    slope = (y - y.mean(axis=1, keepdims=True)) @ xc / (xc @ xc)
    intercept = y.mean(axis=1) - slope * logn.mean()
    pred = floors[:, None] + np.exp(intercept[:, None] + slope[:, None] * logn[None, :])
    k = int(np.argmin(((pred - loss) ** 2).sum(axis=1)))
    return np.array([floors[k], intercept[k], -slope[k]])


def power_law_params(n: np.ndarray, loss: np.ndarray, floor: float | None = None) -> np.ndarray | None:
    """(E, log A, alpha) of L(N) = E + A N^-alpha by least squares on L; None when L does not fall with N.

    floor: E held at this value (below every loss), only log A and alpha fitted: 3 points cannot identify E, since
    3 free parameters pass through them exactly (ablate.report.sections.multipliers.estimate pins E there)."""
    if floor is not None:
        return _pinned_power_law(np.log(n), loss, floor)
    start = _power_law_profile(n, loss)
    if start[2] <= 0:
        return None
    logn = np.log(n)
    top = float(loss.min()) * (1 - 1e-9)
    start[0] = min(max(start[0], 0.0), top * (1 - 1e-6))
    fit = optimize.least_squares(
        lambda p: p[0] + np.exp(p[1] - p[2] * logn) - loss, start, bounds=([0.0, -np.inf, 1e-6], [top, np.inf, 10.0])
    )
    return fit.x


def _pinned_power_law(logn: np.ndarray, loss: np.ndarray, floor: float) -> np.ndarray | None:
    if floor >= loss.min():
        return None
    slope, intercept = np.polyfit(logn, np.log(loss - floor), 1)  # the log-log line: the start
    if slope >= 0:
        return None
    bounds = ([-np.inf, 1e-6], [np.inf, 10.0])
    start = [intercept, -slope]
    fit = optimize.least_squares(lambda p: floor + np.exp(p[0] - p[1] * logn) - loss, start, bounds=bounds)
    return np.array([floor, *fit.x])
