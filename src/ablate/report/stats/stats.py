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
# One noise model for a difference of means, used by every test (fixed, seeds needed, sequential, DA). The eval items
# (and the validation documents) are one fixed sample, the same on every seed, so a difference has two parts:
#     Var(mean difference) = seed_var / k + item_var
# seed_var: the variance of one run-level difference from seed to seed (data order, init, and each evaluation's
# fresh answer noise), divided by the k seeds; item_var: the persistent per-item part (each variant answers some
# items better and others worse, on every seed), which no number of seeds averages away. From the (seeds, items)
# per-item values, a two-way analysis of variance (seeds x items) separates them:
#     fresh     = residual mean square / items          the fresh answer noise in one run-level difference
#     seed_var  = max(per-seed variance, fresh)          a run-level difference never varies less than its fresh
#                                                        noise says (accuracies move in steps: 3 seeds sometimes
#                                                        agree exactly by chance)
#     item_var  = max(0, between-item variance of the seed-averaged per-item difference - residual / k) / items
# Degrees of freedom by Satterthwaite over the two terms (each term's own df: k - 1 seeds; the item term's from the
# items' fourth moment, as few discordant items give a variance estimate from few values), so they follow the
# term that dominates. Without per-item files, each run's logged standard error bounds its items' noise; how much
# of it persists across seeds is unknown, so all of it is taken as persistent (STDERR_ASSUMPTION).

STDERR_ASSUMPTION = (
    "no per-item files: the runs' logged standard errors (stderr_a^2 + stderr_b^2, the two sides' item noise taken "
    "as independent) counted in full as the persistent item-set variance of the mean difference, not divided by "
    "the seeds (an upper bound: per-item files give the split between fresh and persistent noise)"
)


def _two_way(rows: np.ndarray) -> tuple[np.ndarray, float]:
    """(seed-averaged per-item values, residual mean square) of a (seeds, items) matrix, seeds >= 2."""
    k, n = rows.shape
    item_means = rows.mean(axis=0)
    resid = rows - rows.mean(axis=1, keepdims=True) - item_means[None, :] + rows.mean()
    return item_means, float((resid**2).sum() / ((k - 1) * (n - 1)))


def _item_term(item_means: np.ndarray, within: float, within_df: float) -> tuple[float, float]:
    """(item_var, its df): the between-item variance of the seed-averaged per-item values less their within-item
    share `within` (itself estimated on within_df df), over the items; df = 2 E^2 / Var from the items' fourth
    moment (Var(sample variance) = v^2 (2 / (n - 1) + excess kurtosis / n))."""
    n = item_means.size
    between = float(item_means.var(ddof=1))
    value = max(0.0, between - within) / n
    if value <= 0:
        return 0.0, math.inf
    dev = item_means - item_means.mean()
    kurtosis = n * float((dev**4).sum()) / float((dev**2).sum()) ** 2 - 3
    var_between = between**2 * max(2 / (n - 1) + kurtosis / n, 1e-12)
    var_within = 2 * within**2 / within_df if within_df > 0 else 0.0
    return value, max(1.0, 2 * (value * n) ** 2 / (var_between + var_within))  # under 1: a term that is noise


def satterthwaite(terms: list[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of variance estimates [(value, df), ...], each term weighed at the upper end of
    its 80% chi-square interval: a term estimated on few df (the seeds' on k - 1) that came out small by chance
    must not hand the df to a better-estimated term (measured: at 3 seeds x 1000 items with persistent quirks, plain
    Satterthwaite let the whole report claim in 10% of A/A studies)."""
    upper = [(v * df / stats.chi2.ppf(0.1, df) if 1 <= df < 1e7 else v, df) for v, df in terms if v > 0]
    total = sum(v for v, _ in upper)
    spread = sum((v / total) ** 2 / df for v, df in upper if df > 0 and math.isfinite(df))
    return 1 / spread if spread > 0 else math.inf


def paired_noise(diffs: np.ndarray, per_item: np.ndarray | None = None, stderr2: np.ndarray | None = None) -> dict:
    """The noise model of a paired mean difference over k >= 2 seeds: {seed_var, fresh_var, item_var, df, source}.
    diffs: the k run-level differences; per_item: their (k, items) per-item differences; stderr2: without per-item
    values, each seed's stderr_a^2 + stderr_b^2."""
    k = diffs.size
    s2 = float(diffs.var(ddof=1))
    out = {"seed_var": s2, "fresh_var": None, "item_var": 0.0, "item_df": math.inf, "source": None}
    if per_item is not None and per_item.shape[1] >= 2:
        item_means, resid = _two_way(per_item)
        n = per_item.shape[1]
        item_var, item_df = _item_term(item_means, resid / k, (k - 1) * (n - 1))
        out.update(seed_var=max(s2, resid / n), fresh_var=resid / n, item_var=item_var, item_df=item_df)
        out["source"] = "per-item files"
    elif stderr2 is not None:
        out.update(item_var=float(np.mean(stderr2)), source="logged standard errors")
    out["df"] = satterthwaite([(out["seed_var"] / k, k - 1), (out["item_var"], out["item_df"])])
    return out


def unpaired_noise(
    va: np.ndarray, vb: np.ndarray, items_a: np.ndarray | None, items_b: np.ndarray | None, stderr2: float | None
) -> dict:
    """paired_noise for two samples of different seeds (Welch): each side's seed variance over its own seeds
    (floored by its fresh noise), the persistent part of the difference of the two sides' seed-averaged items (or,
    without per-item values, stderr2: the sides' mean logged stderr^2, summed)."""
    var_a, var_b = float(va.var(ddof=1)), float(vb.var(ddof=1))
    out = {"var_a": var_a, "var_b": var_b, "item_var": 0.0, "item_df": math.inf, "source": None}
    if items_a is not None and items_b is not None and items_a.shape[1] >= 2:
        (means_a, resid_a), (means_b, resid_b) = _two_way(items_a), _two_way(items_b)
        n = items_a.shape[1]
        within = resid_a / va.size + resid_b / vb.size
        within_df = satterthwaite(
            [(resid_a / va.size, (va.size - 1) * (n - 1)), (resid_b / vb.size, (vb.size - 1) * (n - 1))]
        )
        item_var, item_df = _item_term(means_a - means_b, within, within_df)
        out.update(var_a=max(var_a, resid_a / n), var_b=max(var_b, resid_b / n), item_var=item_var, item_df=item_df)
        out["source"] = "per-item files"
    elif stderr2 is not None:
        out.update(item_var=stderr2, source="logged standard errors")
    terms = [
        (out["var_a"] / va.size, va.size - 1),
        (out["var_b"] / vb.size, vb.size - 1),
        (out["item_var"], out["item_df"]),
    ]
    out["df"] = satterthwaite(terms)
    return out


def t_interval(mean: float, var_mean: float, df: float | None, level: float) -> list[float] | None:
    """The two-sided `level` interval of a t-test's statistic mean / sqrt(var_mean) on df degrees of freedom (None
    or inf: the normal): mean +- t_(1 - (1 - level) / 2, df) sqrt(var_mean). It excludes 0 exactly when that test's
    p (_floored_t) is below 1 - level. None where the test is not computed (no variance, df under 1)."""
    if not (var_mean > 1e-30) or (df is not None and df < 1):
        return None
    tail = (1 - level) / 2
    crit = stats.norm.isf(tail) if df is None or not math.isfinite(df) else stats.t.isf(tail, df)
    half = float(crit) * math.sqrt(var_mean)
    return [float(mean - half), float(mean + half)]


def mean_interval(
    values: dict[int, float], matrix: np.ndarray | None, stderrs: dict | None, level: float
) -> list[float] | None:
    """A variant's interval for its true score under the noise model of its tests: Var(mean) = max(s^2, fresh) / k
    + item_var over k >= 2 seeds, item_var the item set's sampling variance of the mean (from the (seeds, items)
    matrix, rows in sorted seed order; without it, the runs' logged standard errors squared, as persistent), on
    Satterthwaite's df. values: seed -> run-level score. None under 2 seeds: 1 seed says nothing of seed noise."""
    if len(values) < 2:
        return None
    run_scores = np.array([values[s] for s in sorted(values)], float)
    logged = [stderrs.get(s) for s in sorted(values)] if stderrs else [None]
    stderr2 = None if None in logged else np.square(np.array(logged, float))
    noise = paired_noise(run_scores, matrix, stderr2)
    var_mean = noise["seed_var"] / run_scores.size + noise["item_var"]
    return t_interval(float(run_scores.mean()), var_mean, noise["df"], level)


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
    level: float = 0.95,
) -> dict:
    """Seed-level test of mean(a) - mean(b); a and b map seed -> run-level score.

    Seeds both variants ran (at least 2): a paired t-test over the per-seed differences of those seeds (shared data
    order and init cancel) under the noise model above (items_a/items_b: (seeds, items), rows in each side's sorted
    seed order; without them, stderr_a/stderr_b: seed -> logged standard error). Fewer than 2 shared seeds: Welch's
    t-test over the two samples, plus the persistent item term. sd_diff: the sd of one seed-level difference the
    test used (its seed term, floored by fresh noise); item_sd: the persistent item-set sd of the mean difference;
    noise_floor_sd: the fresh noise floor of one seed-level difference; df: Satterthwaite's; ci: the test's own
    two-sided `level` interval (t_interval: the same variance and df), which excludes 0 exactly when p < 1 - level."""
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
        "item_sd": None,
        "item_df": None,
        "noise_source": None,
        "df": None,
        "ci": None,
        "n_a": len(a),
        "n_b": len(b),
        "n_shared": len(shared),
    }
    if paired:
        d = np.array([a[s] - b[s] for s in shared])
        per_item, stderr2 = None, None
        if items_a is not None and items_b is not None:
            per_item = items_a[[sorted(a).index(s) for s in shared]] - items_b[[sorted(b).index(s) for s in shared]]
        elif stderr_a and stderr_b and all(stderr_a.get(s) is not None and stderr_b.get(s) is not None for s in shared):
            stderr2 = np.array([stderr_a[s] ** 2 + stderr_b[s] ** 2 for s in shared])
        noise = paired_noise(d, per_item, stderr2)
        var_mean = noise["seed_var"] / d.size + noise["item_var"]
        out.update(
            diff=float(d.mean()),
            test="paired t over seeds" + (f", seeds + items ({noise['source']})" if noise["source"] else ""),
            p=_floored_t(float(d.mean()), var_mean, 1, noise["df"]),
            ci=t_interval(float(d.mean()), var_mean, noise["df"], level),
            sd_diff=math.sqrt(noise["seed_var"]),
            sd_seeds=float(d.std(ddof=1)),
        )
        return out | _noise_fields(noise)
    va, vb = np.array([a[s] for s in sorted(a)], float), np.array([b[s] for s in sorted(b)], float)
    if va.size < 2 or vb.size < 2:
        return out
    logged = [[e.get(s) for s in sorted(v)] for e, v in ((stderr_a, a), (stderr_b, b)) if e]
    known = len(logged) == 2 and None not in logged[0] + logged[1]
    stderr2 = sum(float(np.mean(np.square(x))) for x in logged) if known else None
    noise = unpaired_noise(va, vb, items_a, items_b, stderr2)
    se2 = noise["var_a"] / va.size + noise["var_b"] / vb.size + noise["item_var"]
    pooled = math.sqrt(((va.size - 1) * noise["var_a"] + (vb.size - 1) * noise["var_b"]) / (va.size + vb.size - 2))
    out.update(
        test="Welch t over seeds" + (f", seeds + items ({noise['source']})" if noise["source"] else ""),
        p=_floored_t(out["diff"], se2, 1, noise["df"]),
        ci=t_interval(out["diff"], se2, noise["df"], level),
        sd_diff=pooled * math.sqrt(2),
        sd_seeds=math.sqrt((va.var(ddof=1) + vb.var(ddof=1)) / 2) * math.sqrt(2),
    )
    return out | _noise_fields(noise)


def _noise_fields(noise: dict) -> dict:
    fresh = noise.get("fresh_var")
    return {
        "df": _clean(noise["df"]) if math.isfinite(noise["df"]) else None,
        "noise_floor_sd": None if fresh is None else math.sqrt(fresh),
        "item_sd": math.sqrt(noise["item_var"]) if noise["source"] else None,
        "item_df": _clean(noise["item_df"]) if noise["item_var"] > 0 and math.isfinite(noise["item_df"]) else None,
        "noise_source": noise["source"],
    }


def t_power(n: int, effect: float, alpha: float, paired: bool) -> float:
    """Power of the two-sided level-alpha seed-level t-test with n seeds per variant, for a difference of `effect`
    seed-level sds (|diff| / sd_diff): a noncentral t with n - 1 (paired) or 2n - 2 (two-sample) degrees of freedom
    and noncentrality effect x sqrt(n)."""
    return float(_powers(effect * np.sqrt([n]), np.array([n - 1 if paired else 2 * n - 2], float), alpha)[0])


_CHI2_GRID = (np.arange(256) + 0.5) / 256  # quantile midpoints over which the t's denominator is averaged (within
# 1e-3 of the noncentral t where scipy computes it)


def _powers(ncp: np.ndarray, df: np.ndarray, alpha: float) -> np.ndarray:
    """Power of a two-sided level-alpha t-test at noncentralities ncp on df degrees of freedom (arrays). T = (Z +
    ncp) / sqrt(V / df) with V ~ chi2(df): power is the mean over V's quantiles of P(|Z + ncp| > crit sqrt(V / df)),
    normal tails that stay finite at the tiny levels and large effects where scipy's noncentral t returns nan (a
    Benjamini-Hochberg first step of 0.01 / 630, 30 sds). An infinite df is the normal test."""
    ncp, df = np.asarray(ncp, float), np.asarray(df, float)
    out = np.zeros(ncp.shape)
    ok = df >= 1
    if not ok.any():
        return out
    big = np.minimum(df[ok], 1e7)[:, None]  # beyond this the t is the normal to far below 1e-3
    crit = stats.t.ppf(1 - alpha / 2, big)
    bound = crit * np.sqrt(stats.chi2.ppf(_CHI2_GRID[None, :], big) / big)
    shift = ncp[ok][:, None]
    out[ok] = (stats.norm.sf(bound - shift) + stats.norm.cdf(-bound - shift)).mean(axis=1)
    return out


MAX_SEEDS = 1000  # seeds-needed estimates stop here ("more than 1000")


def seeds_needed(
    diff: float,
    sd_diff: float | None,
    alpha: float,
    power: float,
    paired: bool = True,
    item_var: float = 0.0,
    item_df: float | None = None,
) -> int | None:
    """Seeds per variant for the seed-level t-test at level `alpha` to detect `diff` with the given power, under
    the noise model: Var(mean difference) at n seeds = sd_diff^2 / n + item_var (item_var on item_df df, None:
    known), taking both as known. alpha is the level the test must pass: inside a Benjamini-Hochberg family of m
    tests where this is the only real effect, the family's alpha / m (its first step). Starts from the normal
    approximation n = ((z_{1-alpha/2} + z_power) sd_diff / |diff|)^2, rounded up, which is optimistic for few
    seeds, and raises n until the t-test's power (Satterthwaite df) reaches `power`. None without a spread
    estimate or a difference; MAX_SEEDS + 1 for more than MAX_SEEDS, and where the item set alone keeps the power
    below the target at any number of seeds (items_limit says which)."""
    if sd_diff is None or not math.isfinite(sd_diff) or not math.isfinite(diff) or abs(diff) < 1e-15:
        return None
    if items_limit(diff, alpha, power, item_var, item_df):
        return MAX_SEEDS + 1
    if sd_diff <= 0:
        return 2
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power)
    room = diff * diff / (z * z) - item_var  # what the seed term may use at the normal approximation
    n = max(2, math.ceil(sd_diff**2 / room)) if room > 0 else MAX_SEEDS + 1
    n = min(n, MAX_SEEDS + 1)
    while n <= MAX_SEEDS:  # the t-test's power at n, n + 1, ... in blocks (one vectorized call each)
        ns = np.arange(n, min(n + 8, MAX_SEEDS + 1))
        seed_term = sd_diff**2 / ns
        df = np.array(
            [
                satterthwaite([(s, k - 1 if paired else 2 * k - 2), (item_var, item_df or math.inf)])
                for s, k in zip(seed_term, ns)
            ]
        )
        reached = np.nonzero(_powers(abs(diff) / np.sqrt(seed_term + item_var), df, alpha) >= power)[0]
        if reached.size:
            return int(ns[reached[0]])
        n = int(ns[-1]) + 1
    return MAX_SEEDS + 1


def items_limit(diff: float, alpha: float, power: float, item_var: float, item_df: float | None = None) -> bool:
    """Whether the item set alone keeps the test's power at `diff` below `power` however many seeds run: the
    difference is smaller than these items can resolve (more items, not more seeds)."""
    if not item_var > 0 or not math.isfinite(diff) or abs(diff) < 1e-15:
        return False
    df = np.array([item_df if item_df is not None else math.inf])
    return bool(_powers(np.array([abs(diff) / math.sqrt(item_var)]), df, alpha)[0] < power)


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
