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


def signal_noise(final_means, tails) -> dict:
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
    out = {"signal": None, "noise": None, "snr": None, "noise_checkpoints": min((len(t) for t in kept), default=None)}
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
#
# Few seeds and quantized scores: accuracies move in steps of 1/items, so with 3 seeds the per-seed differences are
# sometimes all equal by chance; a t-test would then see no spread and report p = 0. A run-level difference can
# never vary less than its own items' sampling noise says it does, so the variance a test uses is floored by that
# noise (for a paired accuracy difference: the discordant items). The floor only ever makes a test more cautious.


def item_noise(rows: np.ndarray) -> float | None:
    """Sampling variance of one run-level mean from its items, averaged over runs: mean of var(row, ddof 1) / items.
    rows: (runs, items) per-item values (of one side, or of a paired difference)."""
    if rows.ndim != 2 or rows.shape[1] < 2 or rows.shape[0] < 1:
        return None
    return float(np.mean(rows.var(axis=1, ddof=1)) / rows.shape[1])


def _floored_t(mean: float, var: float, n: int, df: float) -> float | None:
    """Two-sided p of mean / sqrt(var / n) on df degrees of freedom. A variance of 0 (no seed spread and no item
    noise known) leaves a nonzero difference untestable (None), never p = 0."""
    if abs(mean) <= 1e-15:
        return 1.0
    if not (var > 1e-30) or df < 1:
        return None
    return _clean(2 * stats.t.sf(abs(mean) / math.sqrt(var / n), df))


def seed_test(
    a: dict[int, float],
    b: dict[int, float],
    items_a: np.ndarray | None = None,
    items_b: np.ndarray | None = None,
    stderr_a: dict[int, float] | None = None,
    stderr_b: dict[int, float] | None = None,
) -> dict:
    """Seed-level test of mean(a) - mean(b); a and b map seed -> run-level score.

    Seeds both variants ran (at least 2): a paired t-test over the per-seed differences of those seeds (shared data
    order and init cancel), k - 1 degrees of freedom, its variance floored by the items' sampling variance of one
    paired difference (items_a/items_b: (seeds, items), rows in each side's sorted seed order); without per-item
    values, by stderr_a^2 + stderr_b^2 (each run's logged standard error: conservative, as it ignores that the two
    sides share items). Fewer than 2 shared seeds: Welch's t-test over the two samples, each variance floored by its
    runs' item noise. sd_diff is the spread of one seed-level difference the test used (floored)."""
    shared = sorted(set(a) & set(b))
    paired = len(shared) >= 2
    out = {
        "diff": float(np.mean(list(a.values())) - np.mean(list(b.values()))),
        "paired": paired,
        "test": None,
        "p": None,
        "sd_diff": None,
        "sd_seeds": None,
        "noise_floor_sd": None,
        "df": None,
        "n_a": len(a),
        "n_b": len(b),
        "n_shared": len(shared),
    }
    if paired:
        d = np.array([a[s] - b[s] for s in shared])
        floor = None
        if items_a is not None and items_b is not None:
            rows_a = items_a[[sorted(a).index(s) for s in shared]]
            rows_b = items_b[[sorted(b).index(s) for s in shared]]
            floor = item_noise(rows_a - rows_b)
        elif stderr_a and stderr_b and all(stderr_a.get(s) is not None and stderr_b.get(s) is not None for s in shared):
            floor = float(np.mean([stderr_a[s] ** 2 + stderr_b[s] ** 2 for s in shared]))
        var = max(float(d.var(ddof=1)), floor or 0.0)
        out.update(
            diff=float(d.mean()),
            test="paired t over seeds" + (", variance floored by item noise" if floor is not None else ""),
            p=_floored_t(float(d.mean()), var, d.size, d.size - 1),
            df=int(d.size - 1),
            sd_diff=math.sqrt(var),
            sd_seeds=float(d.std(ddof=1)),
            noise_floor_sd=None if floor is None else math.sqrt(floor),
        )
        return out
    va, vb = np.array([a[s] for s in sorted(a)], float), np.array([b[s] for s in sorted(b)], float)
    if va.size < 2 or vb.size < 2:
        return out
    floors = [item_noise(m) if m is not None else None for m in (items_a, items_b)]
    var_a, var_b = (max(float(v.var(ddof=1)), f or 0.0) for v, f in zip((va, vb), floors))
    se2 = var_a / va.size + var_b / vb.size
    df = se2**2 / ((var_a / va.size) ** 2 / (va.size - 1) + (var_b / vb.size) ** 2 / (vb.size - 1)) if se2 > 0 else 0
    pooled = math.sqrt(((va.size - 1) * var_a + (vb.size - 1) * var_b) / (va.size + vb.size - 2))
    out.update(
        test="Welch t over seeds" + (", variances floored by item noise" if None not in floors else ""),
        p=_floored_t(out["diff"], se2, 1, df),
        df=_clean(df),
        sd_diff=pooled * math.sqrt(2),
        sd_seeds=math.sqrt((va.var(ddof=1) + vb.var(ddof=1)) / 2) * math.sqrt(2),
    )
    return out


def t_power(n: int, effect: float, alpha: float, paired: bool) -> float:
    """Power of the two-sided level-alpha seed-level t-test with n seeds per variant, for a difference of `effect`
    seed-level sds (|diff| / sd_diff): a noncentral t with n - 1 (paired) or 2n - 2 (two-sample) degrees of freedom
    and noncentrality effect x sqrt(n)."""
    return float(_t_powers(np.array([n]), effect, alpha, paired)[0])


_CHI2_GRID = (np.arange(256) + 0.5) / 256  # quantile midpoints over which the t's denominator is averaged (within
# 1e-3 of the noncentral t where scipy computes it)


def _t_powers(ns: np.ndarray, effect: float, alpha: float, paired: bool) -> np.ndarray:
    """t_power over an array of seed counts. T = (Z + ncp) / sqrt(V / df) with V ~ chi2(df): power is the mean over
    V's quantiles of P(|Z + ncp| > crit sqrt(V / df)), normal tails that stay finite at the tiny levels and large
    effects where scipy's noncentral t returns nan (a Benjamini-Hochberg first step of 0.01 / 630, 30 sds)."""
    ns = np.asarray(ns, float)
    df = ns - 1 if paired else 2 * ns - 2
    out = np.zeros(ns.shape)
    ok = df >= 1
    if not ok.any():
        return out
    df, n = df[ok][:, None], ns[ok][:, None]
    crit = stats.t.ppf(1 - alpha / 2, df)
    bound = crit * np.sqrt(stats.chi2.ppf(_CHI2_GRID[None, :], df) / df)
    ncp = effect * np.sqrt(n)
    out[ok] = (stats.norm.sf(bound - ncp) + stats.norm.cdf(-bound - ncp)).mean(axis=1)
    return out


MAX_SEEDS = 1000  # seeds-needed estimates stop here ("more than 1000")


def seeds_needed(diff: float, sd_diff: float | None, alpha: float, power: float, paired: bool = True) -> int | None:
    """Seeds per variant for the seed-level t-test at level `alpha` to detect `diff` with the given power, taking
    sd_diff (the sd of one seed-level difference) as known. alpha is the level the test must pass: inside a
    Benjamini-Hochberg family of m tests where this is the only real effect, the family's alpha / m (its first
    step). Starts from the normal approximation n = ((z_{1-alpha/2} + z_power) * sd_diff / |diff|)^2, rounded up,
    which is optimistic for few seeds, and raises n until the t-test's power (noncentral t) reaches `power`. None
    without a spread estimate or a difference; an observed spread of 0 gives 2; MAX_SEEDS + 1 for more than
    MAX_SEEDS."""
    if sd_diff is None or not math.isfinite(sd_diff) or not math.isfinite(diff) or abs(diff) < 1e-15:
        return None
    if sd_diff <= 0:
        return 2
    effect = abs(diff) / sd_diff
    n = max(2, math.ceil(((stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)) / effect) ** 2))
    while n <= MAX_SEEDS:  # the t-test's power at n, n + 1, ... in blocks (one vectorized call each)
        ns = np.arange(n, min(n + 8, MAX_SEEDS + 1))
        reached = np.nonzero(_t_powers(ns, effect, alpha, paired) >= power)[0]
        if reached.size:
            return int(ns[reached[0]])
        n = int(ns[-1]) + 1
    return MAX_SEEDS + 1


def sd_interval(sd: float, df: int, level: float = 0.8) -> tuple[float, float] | None:
    """Central `level` interval of the true sd given a sample sd on df degrees of freedom (chi-square): from 3
    seeds (df 2) an 80% interval is [0.66, 3.1] x the observed sd, which is why seeds needed is a range."""
    if df is None or df < 1 or not math.isfinite(sd):
        return None
    tail = (1 - level) / 2
    return (sd * math.sqrt(df / stats.chi2.ppf(1 - tail, df)), sd * math.sqrt(df / stats.chi2.ppf(tail, df)))


def item_pvalue(a: np.ndarray, b: np.ndarray) -> float | None:
    """Paired t-test over items of the seed-averaged difference (a and b: (seeds, items) on the same items). It
    measures evaluation noise only: the seeds are held fixed."""
    per_item = a.mean(axis=0) - b.mean(axis=0)
    if per_item.size < 2:
        return None
    return _floored_t(float(per_item.mean()), float(per_item.var(ddof=1)), per_item.size, per_item.size - 1)


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
