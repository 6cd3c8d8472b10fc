"""The report's statistics: pure functions of numpy arrays, each returning None where it cannot be computed.

Conventions: `matrix` arguments are (seeds, items) arrays of per-item values; "oriented" values are multiplied by
the metric's direction (+1 higher-is-better, -1 lower-is-better) so that larger always means better.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats


def _clean(x) -> float | None:
    return float(x) if x is not None and np.isfinite(x) else None


def bootstrap_mean(matrix: np.ndarray, n_boot: int, seed: int, level: float = 0.95) -> list[float] | None:
    """Percentile CI of the grand mean of a (seeds, items) matrix, resampling seeds and items (two-level bootstrap).

    Items are resampled once per replicate and shared by the seeds, since every seed scored the same items.
    """
    seeds, items = matrix.shape
    if items < 2 or n_boot < 1:
        return None
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    chunk = max(1, 4_000_000 // max(1, seeds * items))  # bound memory to a few tens of MB
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        item_idx = rng.integers(0, items, size=(size, items))
        per_seed = matrix[:, item_idx].mean(axis=2)  # (seeds, size): each seed's mean over resampled items
        seed_idx = rng.integers(0, seeds, size=(size, seeds))
        means[start:start + size] = np.take_along_axis(per_seed.T, seed_idx, axis=1).mean(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return [float(lo), float(hi)]


def _constant(x: np.ndarray) -> bool:
    """Equal up to float rounding (a t-test on such values reports rounding noise, not evidence)."""
    return bool(np.ptp(x) <= 1e-12 * max(1.0, float(np.max(np.abs(x)))))


def paired_comparison(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> dict:
    """Compare variant a with variant b on the same items and seeds; a and b are (seeds, items), row k = seed k.

    - p_items: two-sided paired t-test (scipy.stats.ttest_1samp) over items of the seed-averaged difference a - b;
      it treats the seeds as fixed, so it answers "on these items, with these seeds".
    - ci: 95% two-level bootstrap CI of the mean difference, resampling seed pairs and items, so it also carries
      the seed-to-seed variation the t-test leaves out.
    - p_seeds: paired t-test over the per-seed means (needs >= 2 seeds; weak with few seeds).
    """
    diff = a - b
    per_item = diff.mean(axis=0)
    per_seed = diff.mean(axis=1)
    mean = float(per_item.mean())
    if per_item.size < 2:
        p_items = None
    elif _constant(per_item):  # no spread: zero is no evidence, a constant shift is certain
        p_items = 1.0 if _constant(np.append(per_item, 0.0)) else 0.0
    else:
        p_items = _clean(stats.ttest_1samp(per_item, 0.0).pvalue)
    p_seeds = None
    if per_seed.size >= 2:
        p_seeds = 1.0 if _constant(np.append(per_seed, 0.0)) else (
            0.0 if _constant(per_seed) else _clean(stats.ttest_1samp(per_seed, 0.0).pvalue))
    sign = np.sign(mean)
    return {"diff": mean, "ci": bootstrap_mean(diff, n_boot, seed), "p_items": p_items, "p_seeds": p_seeds,
            "seeds_agree": int(np.sum(np.sign(per_seed) == sign)) if sign != 0 else 0, "n_seeds": int(diff.shape[0]),
            "n_items": int(diff.shape[1])}


def spearman(x, y) -> float | None:
    """Spearman rho; a constant series has no rank order and counts as 0 (no monotone trend)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 3:
        return None
    if np.all(y == y[0]) or np.all(x == x[0]):
        return 0.0
    return _clean(stats.spearmanr(x, y).statistic)


def kendall(x, y) -> float | None:
    """Kendall tau-b between two score vectors over variants. A constant x (all variants tied) carries no ordering:
    0. A constant y (the reference ranking) leaves tau undefined: None."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 2 or np.all(y == y[0]):
        return None
    if np.all(x == x[0]):
        return 0.0
    return _clean(stats.kendalltau(x, y).statistic)


def decision_accuracy(early, final) -> float | None:
    """Share of variant pairs ordered at `early` as at `final` (oriented scores). Pairs tied at `final` are left
    out; a pair tied at `early` counts one half (a coin flip)."""
    early, final = np.asarray(early, float), np.asarray(final, float)
    scores = []
    for i in range(len(final)):
        for j in range(i + 1, len(final)):
            truth = np.sign(final[i] - final[j])
            if truth == 0:
                continue
            guess = np.sign(early[i] - early[j])
            scores.append(0.5 if guess == 0 else float(guess == truth))
    return float(np.mean(scores)) if scores else None


def relative_dispersion(final_means) -> float | None:
    """Signal-and-Noise "signal": the largest gap between variants' final scores over their mean (absolute)."""
    m = np.asarray(final_means, float)
    if m.size < 2 or np.mean(m) == 0:
        return None
    return float((m.max() - m.min()) / abs(m.mean()))


def relative_std(last_values) -> float | None:
    """Signal-and-Noise "noise" of one run: std of its last checkpoints' scores over their mean (absolute)."""
    v = np.asarray(last_values, float)
    if v.size < 2 or np.mean(v) == 0:
        return None
    return float(v.std(ddof=1) / abs(v.mean()))


def std(values) -> float | None:
    v = np.asarray(values, float)
    return float(v.std(ddof=1)) if v.size >= 2 else None


def chance_z(mean: float, stderr: float | None, chance: float | None, sign: int) -> float | None:
    """Distance from chance in standard errors, positive when better than chance."""
    if chance is None or stderr is None or not math.isfinite(stderr) or stderr <= 0:
        return None
    return float(sign * (mean - chance) / stderr)


def mean_or_none(values) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(kept)) if kept else None
