"""What a family of seed-level tests can claim and what it would take: Benjamini-Hochberg's adjusted p-values, the
t-test's power, the seeds a difference needs (and where the item set alone hides it), the range a sample sd leaves.
The noise model they assume is noise.py's.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats

from ablate.report.stats.noise import chi2_quantile, satterthwaite


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
    big = np.minimum(df[ok], 1e7)  # beyond this the t is the normal to far below 1e-3
    crit = np.array([t_quantile(1 - alpha / 2, d) for d in big.tolist()])[:, None]
    bound = crit * np.sqrt(np.stack([_chi2_grid(d) for d in big.tolist()]) / big[:, None])
    shift = ncp[ok][:, None]
    out[ok] = (stats.norm.sf(bound - shift) + stats.norm.cdf(-bound - shift)).mean(axis=1)
    return out


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, df: float) -> float:
    """The t's q quantile on df degrees of freedom, kept: seeds-needed searches and simulated families ask the same
    few (q, df) thousands of times."""
    return float(stats.t.ppf(q, df))


@functools.lru_cache(maxsize=4096)
def _chi2_grid(df: float) -> np.ndarray:
    """chi2(df)'s quantiles at _CHI2_GRID, kept by df (a seed count's df recurs; each is 256 inverse gammas)."""
    grid = stats.chi2.ppf(_CHI2_GRID, df)
    grid.flags.writeable = False  # shared by every caller
    return grid


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
    return (sd * math.sqrt(df / chi2_quantile(1 - tail, df)), sd * math.sqrt(df / chi2_quantile(tail, df)))


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
