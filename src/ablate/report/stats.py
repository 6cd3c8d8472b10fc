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
        means[start : start + size] = np.take_along_axis(per_seed.T, seed_idx, axis=1).mean(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return [float(lo), float(hi)]


def _constant(x: np.ndarray) -> bool:
    """Equal up to float rounding (a t-test on such values reports rounding noise, not evidence)."""
    return bool(np.ptp(x) <= 1e-12 * max(1.0, float(np.max(np.abs(x)))))


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
    return _clean(float(np.clip((rx @ ry) / math.sqrt((rx @ rx) * (ry @ ry)), -1.0, 1.0)))


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
    return _clean(float((sx @ sy) / math.sqrt(np.count_nonzero(sx) * np.count_nonzero(sy))))


def decision_accuracy(early, final) -> float | None:
    """Share of variant pairs ordered at `early` as at `final` (oriented scores). Pairs tied at `final` are left
    out; a pair tied at `early` counts one half (a coin flip). Differences within float rounding are ties."""
    early, final = np.asarray(early, float), np.asarray(final, float)
    if final.size < 2:
        return None
    guess, truth = _pair_signs(early[None, :])[0], _pair_signs(final[None, :])[0]
    scores = [0.5 if g == 0 else float(g == t) for g, t in zip(guess, truth) if t != 0]
    return float(np.mean(scores)) if scores else None


def _pair_signs(means: np.ndarray) -> np.ndarray:
    """sign(mean_i - mean_j) for every pair i < j of the columns of a (replicates, variants) array; differences
    within float rounding of the values count as ties."""
    i, j = np.triu_indices(means.shape[1], 1)
    diff = means[:, i] - means[:, j]
    tol = 1e-12 * max(1.0, float(np.max(np.abs(means))))
    return np.where(np.abs(diff) <= tol, 0.0, np.sign(diff))


def bootstrap_decision_accuracy(
    early: list, final: list, n_boot: int, seed: int, level: float = 0.95
) -> list[float] | None:
    """Percentile CI of decision_accuracy(variant means at `early`, variant means at `final`) over seeds: each
    variant's run-level scores (oriented) are resampled with replacement, at each scale apart, the means recomputed
    and the decision accuracy with them. early[k], final[k]: variant k's scores at the two scales."""
    if n_boot < 1 or len(final) < 2:
        return None
    rng = np.random.default_rng(seed)

    def means(groups):
        return np.stack(
            [np.asarray(g, float)[rng.integers(0, len(g), size=(n_boot, len(g)))].mean(axis=1) for g in groups], axis=1
        )

    guess, truth = _pair_signs(means(early)), _pair_signs(means(final))
    counted = truth != 0
    score = np.where(guess == 0, 0.5, (guess == truth).astype(float)) * counted
    decided = counted.sum(axis=1) > 0
    if not decided.any():
        return None
    da = score[decided].sum(axis=1) / counted[decided].sum(axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(da, [tail, 100 - tail])
    return [float(lo), float(hi)]


def signal_noise(final_means, tails) -> dict:
    """Signal-to-noise ratio as Signal and Noise (Heineman et al., AI2 2025, arXiv 2508.13144) defines it, for one
    metric over one set of variants:
        signal = max_{j,k} |m_j - m_k| / m     (m_j: variant j's final score, m: their mean)
        noise  = std(one run's last checkpoints) / m     (np.std, ddof 0)
        SNR    = signal / noise
    The paper measures noise on one training run; here every run is one, and the noise is the mean of theirs
    (tails: each run's last checkpoint scores). Where the paper divides a run's std by that run's own mean, both are
    divided by the same m here, so SNR = (range of the variants' finals) / (mean within-run std): the same number
    when runs score alike (as variants of one ablation do), and still defined for metrics near or across zero
    (margins), where a run's own mean would make it explode. Signal and noise are None when m is 0; SNR needs only
    a spread: None when the runs' last checkpoints do not move."""
    m = np.asarray(final_means, float)
    sds = [float(np.std(t)) for t in tails if len(t) >= 2]
    out = {"signal": None, "noise": None, "snr": None}
    if m.size < 2 or not sds:
        return out
    spread, sd, ref = float(m.max() - m.min()), float(np.mean(sds)), abs(float(m.mean()))
    if ref > 0:
        out["signal"], out["noise"] = spread / ref, sd / ref
    if sd > 1e-15 * max(1.0, abs(float(m.max()))):
        out["snr"] = spread / sd
    return out


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


# Seed-level inference: the training seed is the unit of replication. A variant's run-level score (its mean over
# the compared items) varies from seed to seed; "A beats B" is a claim about that distribution, so it is tested over
# seeds, not over items (an item-level test holds the seeds fixed and calls seed noise significant).


def _t_pvalue(diffs: np.ndarray) -> float | None:
    """Two-sided one-sample t-test of mean 0; a spread-free sample is decided outright (1: all zero, 0: a constant
    shift), since a t statistic on rounding noise is not evidence."""
    if diffs.size < 2:
        return None
    if _constant(np.append(diffs, 0.0)):
        return 1.0
    if _constant(diffs):
        return 0.0
    t = diffs.mean() / (diffs.std(ddof=1) / math.sqrt(diffs.size))  # scipy's ttest_1samp, without its overhead
    return _clean(2 * stats.t.sf(abs(t), diffs.size - 1))


def seed_test(a: dict[int, float], b: dict[int, float]) -> dict:
    """Seed-level test of mean(a) - mean(b); a and b map seed -> run-level score.

    Same seeds on both sides: paired t-test over the per-seed differences (shared data order and init cancel).
    Otherwise Welch's t-test over the two samples of run scores. sd_diff is the spread of one seed-level difference:
    the sd of the per-seed differences (paired) or the pooled seed sd x sqrt(2) (unpaired)."""
    paired = sorted(a) == sorted(b)
    va, vb = np.array([a[s] for s in sorted(a)], float), np.array([b[s] for s in sorted(b)], float)
    diff = float(va.mean() - vb.mean())
    out = {
        "diff": diff,
        "paired": paired,
        "test": None,
        "p": None,
        "sd_diff": None,
        "df": None,
        "n_a": int(va.size),
        "n_b": int(vb.size),
    }
    if paired:
        d = va - vb
        out.update(
            test="paired t over seeds",
            p=_t_pvalue(d),
            df=int(d.size - 1) if d.size >= 2 else None,
            sd_diff=float(d.std(ddof=1)) if d.size >= 2 else None,
        )
        return out
    if va.size < 2 or vb.size < 2:
        return out
    pooled = math.sqrt(((va.size - 1) * va.var(ddof=1) + (vb.size - 1) * vb.var(ddof=1)) / (va.size + vb.size - 2))
    out.update(test="Welch t over seeds", sd_diff=pooled * math.sqrt(2))
    if _constant(va) and _constant(vb):
        out["p"] = 1.0 if _constant(np.array([va[0], vb[0]])) else 0.0
    else:
        res = stats.ttest_ind(va, vb, equal_var=False)
        out["p"] = _clean(res.pvalue)
        out["df"] = _clean(getattr(res, "df", None))
    return out


def t_power(n: int, effect: float, alpha: float, paired: bool) -> float:
    """Power of the two-sided level-alpha seed-level t-test with n seeds per variant, for a difference of `effect`
    seed-level sds (|diff| / sd_diff): noncentral t with n - 1 (paired) or 2n - 2 (two-sample) degrees of freedom
    and noncentrality effect x sqrt(n)."""
    df = n - 1 if paired else 2 * n - 2
    if df < 1:
        return 0.0
    crit = stats.t.ppf(1 - alpha / 2, df)
    ncp = effect * math.sqrt(n)
    return float(stats.nct.sf(crit, df, ncp) + stats.nct.cdf(-crit, df, ncp))


def seeds_needed(diff: float, sd_diff: float | None, alpha: float, power: float, paired: bool = True) -> int | None:
    """Seeds per variant for the seed-level t-test to detect `diff` with the given power at level alpha, taking
    sd_diff (the sd of one seed-level difference) as known. Starts from the normal approximation
    n = ((z_{1-alpha/2} + z_power) * sd_diff / |diff|)^2, rounded up, which is optimistic for few seeds, and raises n
    until the t-test's power (noncentral t) reaches `power`. None without a spread estimate or a difference; an
    observed spread of 0 gives 2."""
    if sd_diff is None or not math.isfinite(sd_diff) or not math.isfinite(diff) or abs(diff) < 1e-15:
        return None
    if sd_diff <= 0:
        return 2
    effect = abs(diff) / sd_diff
    n = max(2, math.ceil(((stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)) / effect) ** 2))
    while n < 100_000 and t_power(n, effect, alpha, paired) < power:
        n += 1
    return n


def item_pvalue(a: np.ndarray, b: np.ndarray) -> float | None:
    """Paired t-test over items of the seed-averaged difference (a and b: (seeds, items) on the same items). It
    measures evaluation noise only: the seeds are held fixed."""
    per_item = a.mean(axis=0) - b.mean(axis=0)
    if per_item.size < 2:
        return None
    return _t_pvalue(per_item)


def bootstrap_diff(
    a: np.ndarray, b: np.ndarray, paired: bool, n_boot: int, seed: int, level: float = 0.95
) -> list[float] | None:
    """Two-level bootstrap CI of mean(a) - mean(b) over (seeds, items) matrices on the same items: resample seeds
    (seed pairs when paired, each side's seeds apart otherwise), then items (shared by every run)."""
    if paired:
        return bootstrap_mean(a - b, n_boot, seed, level)
    items = a.shape[1]
    if items < 2 or n_boot < 1 or a.shape[0] < 1 or b.shape[0] < 1:
        return None
    rng = np.random.default_rng(seed)
    diffs = np.empty(n_boot)
    chunk = max(1, 4_000_000 // max(1, (a.shape[0] + b.shape[0]) * items))
    for start in range(0, n_boot, chunk):
        size = min(chunk, n_boot - start)
        item_idx = rng.integers(0, items, size=(size, items))
        means = []
        for m in (a, b):
            per_seed = m[:, item_idx].mean(axis=2).T  # (size, seeds)
            pick = rng.integers(0, m.shape[0], size=(size, m.shape[0]))
            means.append(np.take_along_axis(per_seed, pick, axis=1).mean(axis=1))
        diffs[start : start + size] = means[0] - means[1]
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(diffs, [tail, 100 - tail])
    return [float(lo), float(hi)]


def bh_adjust(pvalues) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (step-up, monotone, capped at 1), in the input order. Rejecting where
    the adjusted p < alpha controls the false discovery rate at alpha over the family."""
    p = np.asarray(pvalues, float)
    m = p.size
    if m == 0:
        return []
    order = np.argsort(p)
    scaled = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(scaled[::-1])[::-1].clip(max=1.0)
    out = np.empty(m)
    out[order] = adjusted
    return [float(x) for x in out]
