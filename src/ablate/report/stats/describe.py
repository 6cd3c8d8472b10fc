"""Descriptive statistics of scores: rank correlations (Spearman, Kendall), decision accuracy and the pairs' signs
it rests on, signal-to-noise, a sample's sd, the distance from chance, a mean over what is known. Pure functions of
numpy arrays, each returning None where it cannot be computed.

"Oriented" values are multiplied by the metric's direction (+1 higher-is-better, -1 lower-is-better) so that larger
always means better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def finite(x) -> float | None:
    """x as a float; None where it is missing or not finite (what a statistic returns where it cannot be computed)."""
    return float(x) if x is not None and np.isfinite(x) else None


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks from 1 (ties share the mean of their ranks), as scipy's rankdata, without its call overhead."""
    order = np.argsort(x, kind="mergesort")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(x.size)
    xs = x[order]
    first = np.r_[True, xs[1:] != xs[:-1]]
    dense = first.cumsum()[inverse]
    bounds = np.r_[np.nonzero(first)[0], x.size]
    return 0.5 * (bounds[dense] + bounds[dense - 1] + 1)


def spearman(x, y) -> float | None:
    """Spearman rho (Pearson correlation of average ranks); a constant series has no rank order and counts as 0 (no
    monotone trend)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 3:
        return None
    if np.all(y == y[0]) or np.all(x == x[0]):
        return 0.0
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return finite(float(np.clip((rx @ ry) / math.sqrt((rx @ rx) * (ry @ ry)), -1.0, 1.0)))


def kendall(x, y) -> float | None:
    """Kendall tau-b between two score vectors over variants. A constant x (all variants tied) carries no ordering:
    0. A constant y (the reference ranking) leaves tau undefined: None."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 2 or np.all(y == y[0]):
        return None
    if np.all(x == x[0]):
        return 0.0
    i, j = np.triu_indices(x.size, 1)  # tau-b from the pairs' signs (scipy's kendalltau, without its overhead)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    return finite(float((sx @ sy) / math.sqrt(np.count_nonzero(sx) * np.count_nonzero(sy))))


def decision_accuracy(early, final) -> float | None:
    """Share of variant pairs ordered at `early` as at `final` (oriented scores). Pairs tied at `final` are left
    out; a pair tied at `early` counts one half (a coin flip). Differences within float rounding are ties."""
    early, final = np.asarray(early, float), np.asarray(final, float)
    if final.size < 2:
        return None
    guess, truth = pair_signs(early), pair_signs(final)
    scores = [0.5 if g == 0 else float(g == t) for g, t in zip(guess, truth) if t != 0]
    return float(np.mean(scores)) if scores else None


def pair_signs(means: np.ndarray) -> np.ndarray:
    """sign(m_i - m_j) for every pair i < j along the last axis (any leading axes: replicates); differences within
    float rounding of the values count as ties."""
    i, j = np.triu_indices(means.shape[-1], 1)
    diff = means[..., i] - means[..., j]
    tol = 1e-12 * max(1.0, float(np.max(np.abs(means))))
    return np.where(np.abs(diff) <= tol, 0.0, np.sign(diff))


@dataclass(frozen=True)
class SignalNoise:
    """signal_noise's figures, each None where it cannot be computed."""

    signal: float | None
    noise: float | None
    snr: float | None
    noise_checkpoints: int | None  # the n the noise is measured over (the fewest checkpoints any run had)


def signal_noise(final_means, tails) -> SignalNoise:
    """Signal-to-noise ratio as Signal and Noise (Heineman et al., AI2 2025, arXiv 2508.13144) defines it, for one
    metric over one set of variants:
        signal = max_{j,k} |m_j - m_k| / m     (m_j: variant j's score at the comparison point, m: their mean)
        noise  = sd(one run's last n checkpoints up to the comparison point, ddof 1) / m
        SNR    = signal / noise
    The paper measures noise on one training run; here every run is one, and the noise is the mean of theirs
    (tails: each run's last checkpoint scores up to the compared one). Where the paper divides a run's sd by that
    run's own mean, both are divided by the same m here, so SNR = (range of the variants' scores) / (mean within-run
    sd): the same number when runs score alike (as variants of one ablation do), and still defined for metrics near
    or across zero (margins), where a run's own mean would make it explode. Signal and noise are None when m is 0;
    SNR needs only a spread: None when the runs' last checkpoints do not move. noise_checkpoints: the n used (the
    fewest any run had)."""
    m = np.asarray(final_means, float)
    kept = [t for t in tails if len(t) >= 2]
    sds = [float(np.std(t, ddof=1)) for t in kept]
    checkpoints = min((len(t) for t in kept), default=None)
    if m.size < 2 or not sds:
        return SignalNoise(None, None, None, checkpoints)
    spread, sd, ref = float(m.max() - m.min()), float(np.mean(sds)), abs(float(m.mean()))
    moves = sd > 1e-15 * max(1.0, abs(float(m.max())))
    return SignalNoise(
        signal=spread / ref if ref > 0 else None,
        noise=sd / ref if ref > 0 else None,
        snr=spread / sd if moves else None,
        noise_checkpoints=checkpoints,
    )


def std(values) -> float | None:
    v = np.asarray(values, float)
    return float(v.std(ddof=1)) if v.size >= 2 else None


def chance_z(mean: float, stderr: float | None, chance: float | None, sign: int) -> float | None:
    """Distance from chance in standard errors, positive when better than chance."""
    if chance is None or stderr is None or not math.isfinite(stderr) or stderr < 0:
        return None
    if stderr == 0:  # every item alike: exactly at chance is at chance (a greedy accuracy of 0); else unknown
        return 0.0 if mean == chance else None
    return float(sign * (mean - chance) / stderr)


def mean_or_none(values) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(kept)) if kept else None
