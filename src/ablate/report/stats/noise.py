"""Seed-level inference: the noise model of a difference of means (seed spread plus the item set's sampling
variance), t intervals, the seed test of one pair and the item-level p (evaluation noise only). Pure functions of
numpy arrays, each returning None where it cannot be computed; `matrix` arguments are (seeds, items) arrays of
per-item values.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ablate.report.stats.describe import finite


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


@functools.lru_cache(maxsize=4096)
def chi2_quantile(q: float, df: float) -> float:
    """chi2(df)'s q quantile, kept: the seed terms' df (k - 1) recur in every pair of every series."""
    return float(stats.chi2.ppf(q, df))


def satterthwaite(terms: list[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of variance estimates [(value, df), ...], each term weighed at the upper end of
    its 80% chi-square interval: a term estimated on few df (the seeds' on k - 1) that came out small by chance
    must not hand the df to a better-estimated term (measured: at 3 seeds x 1000 items with persistent quirks, plain
    Satterthwaite let the whole report claim in 10% of A/A studies)."""
    upper = [(v * df / chi2_quantile(0.1, df) if 1 <= df < 1e7 else v, df) for v, df in terms if v > 0]
    total = sum(v for v, _ in upper)
    spread = sum((v / total) ** 2 / df for v, df in upper if df > 0 and math.isfinite(df))
    return 1 / spread if spread > 0 else math.inf


@dataclass(frozen=True)
class Noise:
    """The noise model of a mean difference: Var = seed term + item_var on Satterthwaite's df. Paired (one sample
    of per-seed differences): seed_var, floored by fresh_var (the fresh answer noise of one run-level difference,
    None without per-item values). Unpaired (Welch): var_a and var_b, each side's seed variance, floored by its
    fresh noise. item_var: the persistent item term on item_df (inf: known); source: "per-item files", "logged
    standard errors", or None (seeds only)."""

    item_var: float
    item_df: float
    df: float
    source: str | None
    seed_var: float | None = None
    fresh_var: float | None = None
    var_a: float | None = None
    var_b: float | None = None


def paired_noise(diffs: np.ndarray, per_item: np.ndarray | None = None, stderr2: np.ndarray | None = None) -> Noise:
    """The noise model of a paired mean difference over k >= 2 seeds. diffs: the k run-level differences; per_item:
    their (k, items) per-item differences; stderr2: without per-item values, each seed's stderr_a^2 + stderr_b^2."""
    k = diffs.size
    seed_var, fresh_var, item_var, item_df, source = float(diffs.var(ddof=1)), None, 0.0, math.inf, None
    if per_item is not None and per_item.shape[1] >= 2:
        item_means, resid = _two_way(per_item)
        n = per_item.shape[1]
        item_var, item_df = _item_term(item_means, resid / k, (k - 1) * (n - 1))
        seed_var, fresh_var, source = max(seed_var, resid / n), resid / n, "per-item files"
    elif stderr2 is not None:
        item_var, source = float(np.mean(stderr2)), "logged standard errors"
    df = satterthwaite([(seed_var / k, k - 1), (item_var, item_df)])
    return Noise(item_var, item_df, df, source, seed_var=seed_var, fresh_var=fresh_var)


def unpaired_noise(
    va: np.ndarray, vb: np.ndarray, items_a: np.ndarray | None, items_b: np.ndarray | None, stderr2: float | None
) -> Noise:
    """paired_noise for two samples of different seeds (Welch): each side's seed variance over its own seeds
    (floored by its fresh noise), the persistent part of the difference of the two sides' seed-averaged items (or,
    without per-item values, stderr2: the sides' mean logged stderr^2, summed)."""
    var_a, var_b, item_var, item_df, source = float(va.var(ddof=1)), float(vb.var(ddof=1)), 0.0, math.inf, None
    if items_a is not None and items_b is not None and items_a.shape[1] >= 2:
        (means_a, resid_a), (means_b, resid_b) = _two_way(items_a), _two_way(items_b)
        n = items_a.shape[1]
        within = resid_a / va.size + resid_b / vb.size
        within_df = satterthwaite(
            [(resid_a / va.size, (va.size - 1) * (n - 1)), (resid_b / vb.size, (vb.size - 1) * (n - 1))]
        )
        item_var, item_df = _item_term(means_a - means_b, within, within_df)
        var_a, var_b, source = max(var_a, resid_a / n), max(var_b, resid_b / n), "per-item files"
    elif stderr2 is not None:
        item_var, source = stderr2, "logged standard errors"
    df = satterthwaite([(var_a / va.size, va.size - 1), (var_b / vb.size, vb.size - 1), (item_var, item_df)])
    return Noise(item_var, item_df, df, source, var_a=var_a, var_b=var_b)


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
    var_mean = noise.seed_var / run_scores.size + noise.item_var
    return t_interval(float(run_scores.mean()), var_mean, noise.df, level)


def _floored_t(mean: float, var: float, n: int, df: float) -> float | None:
    """Two-sided p of mean / sqrt(var / n) on df degrees of freedom. A variance of 0 (no seed spread and no item
    noise known) leaves a nonzero difference untestable (None), never p = 0."""
    if abs(mean) <= 1e-15:
        return 1.0
    if not (var > 1e-30) or df < 1:
        return None
    return finite(2 * stats.t.sf(abs(mean) / math.sqrt(var / n), df))


@dataclass(frozen=True)
class SeedTest:
    """One pair's seed-level test (seed_test): the difference of the two means, whether it paired the seeds, and the
    seed counts; the test's figures None where it was not run (fewer than 2 seeds a side)."""

    diff: float
    paired: bool
    n_a: int
    n_b: int
    n_shared: int
    test: str | None = None  # "paired t over seeds" or "Welch t over seeds", and the item term's source
    p: float | None = None
    ci: list[float] | None = None  # the test's own interval (t_interval: the same variance and df)
    sd_diff: float | None = None  # the sd of one seed-level difference the test used (floored by fresh noise)
    sd_seeds: float | None = None  # the same, unfloored: the seeds' own spread
    noise_floor_sd: float | None = None  # the fresh noise floor of one seed-level difference
    item_sd: float | None = None  # the persistent item-set sd of the mean difference
    item_df: float | None = None
    noise_source: str | None = None
    df: float | None = None  # Satterthwaite's; None: infinite (the normal)


def seed_test(
    a: dict[int, float],
    b: dict[int, float],
    items_a: np.ndarray | None = None,
    items_b: np.ndarray | None = None,
    stderr_a: dict[int, float] | None = None,
    stderr_b: dict[int, float] | None = None,
    level: float = 0.95,
) -> SeedTest:
    """Seed-level test of mean(a) - mean(b); a and b map seed -> run-level score.

    Seeds both variants ran (at least 2): a paired t-test over the per-seed differences of those seeds (shared data
    order and init cancel) under the noise model above (items_a/items_b: (seeds, items), rows in each side's sorted
    seed order; without them, stderr_a/stderr_b: seed -> logged standard error). Fewer than 2 shared seeds: Welch's
    t-test over the two samples, plus the persistent item term. Its `ci`, at the two-sided `level`, excludes 0
    exactly when p < 1 - level."""
    shared = sorted(set(a) & set(b))
    untested = SeedTest(
        diff=float(np.mean(list(a.values())) - np.mean(list(b.values()))),
        paired=len(shared) >= 2,
        n_a=len(a),
        n_b=len(b),
        n_shared=len(shared),
    )
    if len(shared) >= 2:
        return _paired_test(untested, a, b, shared, items_a, items_b, stderr_a, stderr_b, level)
    if len(a) < 2 or len(b) < 2:
        return untested
    return _welch_test(untested, a, b, items_a, items_b, stderr_a, stderr_b, level)


def _paired_test(untested: SeedTest, a, b, shared, items_a, items_b, stderr_a, stderr_b, level: float) -> SeedTest:
    """The paired t over the per-seed differences of the shared seeds (at least 2)."""
    d = np.array([a[s] - b[s] for s in shared])
    per_item, stderr2 = None, None
    if items_a is not None and items_b is not None:
        per_item = items_a[[sorted(a).index(s) for s in shared]] - items_b[[sorted(b).index(s) for s in shared]]
    elif stderr_a and stderr_b and all(stderr_a.get(s) is not None and stderr_b.get(s) is not None for s in shared):
        stderr2 = np.array([stderr_a[s] ** 2 + stderr_b[s] ** 2 for s in shared])
    noise = paired_noise(d, per_item, stderr2)
    var_mean = noise.seed_var / d.size + noise.item_var
    return dataclasses.replace(
        untested,
        diff=float(d.mean()),
        test="paired t over seeds" + (f", seeds + items ({noise.source})" if noise.source else ""),
        p=_floored_t(float(d.mean()), var_mean, 1, noise.df),
        ci=t_interval(float(d.mean()), var_mean, noise.df, level),
        sd_diff=math.sqrt(noise.seed_var),
        sd_seeds=float(d.std(ddof=1)),
        **_noise_fields(noise),
    )


def _welch_test(untested: SeedTest, a, b, items_a, items_b, stderr_a, stderr_b, level: float) -> SeedTest:
    """Welch's t over the two samples (each at least 2 seeds, fewer than 2 shared), plus the persistent item term."""
    va, vb = np.array([a[s] for s in sorted(a)], float), np.array([b[s] for s in sorted(b)], float)
    logged = [[e.get(s) for s in sorted(v)] for e, v in ((stderr_a, a), (stderr_b, b)) if e]
    known = len(logged) == 2 and None not in logged[0] + logged[1]
    stderr2 = sum(float(np.mean(np.square(x))) for x in logged) if known else None
    noise = unpaired_noise(va, vb, items_a, items_b, stderr2)
    se2 = noise.var_a / va.size + noise.var_b / vb.size + noise.item_var
    pooled = math.sqrt(((va.size - 1) * noise.var_a + (vb.size - 1) * noise.var_b) / (va.size + vb.size - 2))
    return dataclasses.replace(
        untested,
        test="Welch t over seeds" + (f", seeds + items ({noise.source})" if noise.source else ""),
        p=_floored_t(untested.diff, se2, 1, noise.df),
        ci=t_interval(untested.diff, se2, noise.df, level),
        sd_diff=pooled * math.sqrt(2),
        sd_seeds=math.sqrt((va.var(ddof=1) + vb.var(ddof=1)) / 2) * math.sqrt(2),
        **_noise_fields(noise),
    )


def _noise_fields(noise: Noise) -> dict:
    """The noise model's figures as SeedTest names them: sds, and a df of None where it is infinite."""
    return {
        "df": finite(noise.df) if math.isfinite(noise.df) else None,
        "noise_floor_sd": None if noise.fresh_var is None else math.sqrt(noise.fresh_var),
        "item_sd": math.sqrt(noise.item_var) if noise.source else None,
        "item_df": finite(noise.item_df) if noise.item_var > 0 and math.isfinite(noise.item_df) else None,
        "noise_source": noise.source,
    }


def item_pvalue(a: np.ndarray, b: np.ndarray) -> float | None:
    """Paired t-test over items of the seed-averaged difference (a and b: (seeds, items) on the same items). It
    measures evaluation noise only: the seeds are held fixed."""
    per_item = a.mean(axis=0) - b.mean(axis=0)
    if per_item.size < 2:
        return None
    return _floored_t(float(per_item.mean()), float(per_item.var(ddof=1)), per_item.size, per_item.size - 1)
