"""The group-sequential design of an adaptive study: alpha spent over looks fixed before round 1.

An adaptive study looks after each round, at n paired seeds, up to the max_seeds N its rule recorded. The
anytime-valid design (sequential.py) pays for stopping at any time; this one uses what the rule fixed in advance.

Information. The noise model of the fixed report (noise.seed_test) puts the mean difference's variance at
sigma^2 / n + tau^2: a per-seed part that seeds average away and an item-set part (the same validation documents or
task items on every seed) that they do not. The information at n seeds is its inverse, so the information fraction
is I(n) / I(N) = (1/N + rho) / (1/n + rho), rho = tau^2 / sigma^2 the item-set share. rho is not known before the
study: tau^2 is (from many items), sigma^2 only through the seeds' s^2 on n - 1 degrees of freedom. A schedule or
boundaries read off an estimated rho inflate the error: at 2 degrees of freedom a small s^2 (which happens) claims a
large share, lighter-tailed boundaries and a larger |t| at once (measured: a 6-variant A/A with tau^2 = 0.1 sigma^2
made a wrong decision in 12% of studies at alpha 0.05, the share from an 80% upper bound on sigma^2; one contrast at
alpha 0.05 / 15, boundaries calibrated for the share at each look's point estimate: 8-10 alpha at true shares
0.003-0.03, and still 2.2-2.7 alpha with the share's 95% lower confidence bound). So the schedule is the seeds' own,
fractions n / N (rho = 0), and the item term enters each look's critical value instead (Boundaries).

Spending (Lan and DeMets 1983): the cumulative error allowed by fraction f, two-sided, for a contrast's alpha:
  pocock           alpha * ln(1 + (e - 1) f)                          spends early: decides a clear loser at 3 seeds
  obrien_fleming   2 - 2 Phi(z_(1 - alpha / 2) / sqrt(f))             spends late: the most power at the last look
  hsd:G            alpha * (1 - exp(-G f)) / (1 - exp(-G))            Hwang, Shih and DeCani; G = 1 near pocock, -4
                                                                      near obrien_fleming
The default (sequential.DEFAULT_SPENDING) is obrien_fleming, chosen with Holm's recycling and the futility chance
below by scripts/simulate_sequential.py --spendings (docs/reports.md). Spending handles looks that were not
planned: a skipped look, a round that trained fewer seeds, a stop for budget keep the guarantee (each look spends
what its own fraction allows). Raising N after results changes the fractions of
looks already taken, and so is refused (sequential.voids_guarantee).

Boundaries. The study's statistic is a t: t_n = mean / sqrt((s^2 + n tau^2) / n) on n - 1 degrees of freedom.
Boundaries for z converted at the same nominal p inflate alpha by 16-22% at 2-7 degrees of freedom, so the seeds'
boundaries a_k are calibrated for the t of seeds alone by simulation under no difference (SIMULATED_STUDIES studies
of per-seed normal noise): a_k is the |t_k| that the simulated studies still running at look k exceed with
probability spent(f_k) - spent(f_(k-1)). Seeded, and cached by everything they depend on: the looks, N, alpha (the
contrast's), the spending (and rho, 0 in every decision; the simulation takes others to measure a known share).
The item part is held to its own boundary, b = z_(1 - 0.9 alpha / 2) (item_critical), the same at every look: each
look's repeated interval is mean_k +- sqrt(a_k^2 s_k^2 / n_k + b^2 tau^2), its critical |t| combined_critical's
sqrt((a_k^2 s_k^2 / n_k + b^2 tau^2) / (s_k^2 / n_k + tau^2)): a_k without an item term (unchanged), near b where
the items dominate. At one look that holds alpha whatever rho (combined_critical: Banerjee's interval); over looks
3..8 of 8 it was measured (scripts/simulate_sequential.py --item-shares: 200,000 null studies a cell at alpha
0.05 / 3 and 0.05 / 15 under hsd:-2, 0.05 / 3 under obrien_fleming, 0.05 under pocock; rho 0 to 100): 0.31-1.03
of alpha, the most at rho near 0 (the seeds' own boundaries, Monte Carlo error) and at large rho; the seeds'
boundaries alone spend 0.00-0.11 of it at rho >= 0.1. At one look this is the fixed report's t with the item part at
z rather than t (the items' variance is estimated from many items), so the fixed design (one look) gains too.

Repeated confidence intervals: mean_k +- c_k se_k, c_k each look's critical |t|. With probability >= 1 - alpha
(measured as above where the item term is present) every interval of every look covers the true difference at
once: a decision read from them (0 excluded: the better side; inside +-margin: equivalent) is wrong with
probability <= alpha, at whatever look the study stops.

Futility (non-binding): a contrast whose estimated chance of being decided by N seeds, if the difference is what it
seems now, is below a threshold is closed for futility. The chance (decision_chance) is conditional power with the
last look's mean and variance both random: the remaining seeds drawn from N(mean, s^2) as seen, the item variance
fixed. It is not a claim that no design could decide the contrast, only that this study stops spending seeds on it.
The boundaries never assume the rule is followed (they are computed as if every study ran to its last look), so the
error guarantee holds whether or not it is: closing early only gives up power.
"""

from __future__ import annotations

import math
from functools import lru_cache

SPENDINGS = ("pocock", "obrien_fleming", "hsd:G (G a number, e.g. hsd:-2)")
SIMULATED_STUDIES = 200_000  # under no difference; c_k's Monte Carlo error is a few percent at alpha / K = 0.003
CHANCE_GRID = (256, 32)  # decision_chance: quantile nodes of the coming seeds' mean and of their sum of squares


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def _normal_quantile(p: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(p))


def check_spending(spending: str) -> None:
    """ValueError naming the allowed values when `spending` is none of them."""
    if spending in ("pocock", "obrien_fleming"):
        return
    if spending.startswith("hsd:"):
        try:
            gamma = float(spending[4:])
        except ValueError:
            gamma = math.nan
        if math.isfinite(gamma):
            return
    raise ValueError(f"spending {spending!r}; allowed: {', '.join(SPENDINGS)}")


def spent(fraction: float, alpha: float, spending: str) -> float:
    """The error a contrast of level alpha may have spent by information fraction `fraction` (0..1), two-sided."""
    check_spending(spending)
    f = min(max(fraction, 0.0), 1.0)
    if f <= 0:
        return 0.0
    if spending == "pocock":
        return alpha * math.log(1 + (math.e - 1) * f)
    if spending == "obrien_fleming":
        return 2 - 2 * _normal_cdf(_normal_quantile(1 - alpha / 2) / math.sqrt(f))
    gamma = float(spending[4:])
    if abs(gamma) < 1e-9:
        return alpha * f
    return alpha * (1 - math.exp(-gamma * f)) / (1 - math.exp(-gamma))


def information_fraction(n: int, max_seeds: int, item_share: float = 0.0) -> float:
    """I(n) / I(N) under the noise model: (1/N + rho) / (1/n + rho); n / N for seeds alone (rho = 0)."""
    return min(1.0, (1 / max_seeds + item_share) / (1 / n + item_share))


def boundaries(looks, max_seeds: int, alpha: float, spending: str, rho: float = 0.0, noise=None) -> tuple[float, ...]:
    """The critical |t| at each look (seeds paired at it: rising, each >= 2 and <= max_seeds); inf where a look may
    not decide (nothing left to spend, or 2 seeds). Without `noise`: the seeds' boundaries a_k (rho = 0; another
    rho: those of a known item share, for simulations). noise: the observed (per-seed variance, item variance) at
    each look (the last one stands for looks not yet taken): each look's critical |t| under the item term,
    combined_critical(a_k, item_critical(alpha), ...), which is a_k where the item variance is 0."""
    looks = tuple(int(n) for n in looks)
    if any(b <= a for a, b in zip(looks, looks[1:])) or not looks or looks[0] < 2 or looks[-1] > max_seeds:
        raise ValueError(f"looks {looks}: rising seed counts from 2 to max_seeds={max_seeds}")
    seeds = _boundaries(looks, max_seeds, float(alpha), spending, float(rho))
    if not noise:
        return seeds
    noise = list(noise)
    item = item_critical(alpha)
    return tuple(
        combined_critical(a, item, *noise[min(k, len(noise) - 1)], n) for k, (a, n) in enumerate(zip(seeds, looks))
    )


ITEM_LEVEL = 0.9  # the item part's boundary is z at ITEM_LEVEL x alpha: see item_critical


def item_critical(alpha: float) -> float:
    """b, the item part's critical value: the normal quantile of two-sided level ITEM_LEVEL x alpha. The same at
    every look, since the item-set offset is the same at every look; below alpha because the seeds' noise differs
    from look to look, which gives a large item share a little more than one chance to cross (measured in an
    exploration: up to 1.06 alpha with b at alpha itself, shares 10-100; 0.82-0.96 at 0.9 alpha:
    scripts/simulate_sequential.py --item-shares)."""
    return _normal_quantile(1 - ITEM_LEVEL * alpha / 2)


def combined_critical(seed_critical, item_critical, seed_var, item_var, n):
    """The critical |t| of a look of n seeds with per-seed variance s^2 and item variance tau^2: the repeated
    interval's half-width sqrt(a^2 s^2 / n + b^2 tau^2), a the seeds' boundary, b item_critical's, over the se
    sqrt(s^2 / n + tau^2); a where tau^2 is 0, b where s^2 is (numpy arrays or numbers).

    Each part is held to its own boundary, as if its variance were the only one (Banerjee 1961's interval for two
    means from separate variances, with one variance known). At one look it holds alpha whatever rho: with
    w = (sigma^2 / n) / (sigma^2 / n + tau^2), the half-width is >= (a s / sigma) w + b (1 - w) standard errors
    (Cauchy-Schwarz), the mean is normal and independent of s, and P(|Z| >= c) is convex in c, so the miss chance is
    <= w P(|t| >= a) + (1 - w) P(|Z| >= b) <= alpha. Over several looks scripts/simulate_sequential.py measures it."""
    import numpy as np

    if np.isscalar(seed_critical) and not math.isfinite(seed_critical):
        return math.inf
    seed_part, item_part = np.divide(seed_var, n), item_var
    total = seed_part + item_part
    squared = seed_critical**2 * seed_part + item_critical**2 * item_part
    out = np.sqrt(np.divide(squared, np.where(total > 0, total, 1.0)))
    out = np.where(total > 0, out, seed_critical)
    return float(out) if np.ndim(out) == 0 else out


@lru_cache(maxsize=1024)
def _boundaries(looks: tuple[int, ...], max_seeds: int, alpha: float, spending: str, rho: float) -> tuple:
    import numpy as np

    t = simulated_t(looks, rho, SIMULATED_STUDIES, seed=0)
    running = np.ones(len(t), dtype=bool)
    out, before = [], 0.0
    for k, n in enumerate(looks):
        upto = spent(information_fraction(n, max_seeds, rho), alpha, spending)
        crossing = int(round((upto - before) * len(t)))
        before = upto
        size = np.abs(t[:, k])
        alive = size[running]
        if n < 3 or crossing <= 0 or not len(alive):  # 2 seeds: one degree of freedom decides nothing here
            out.append(math.inf)
            continue
        crossing = min(crossing, len(alive))
        c = float(np.partition(alive, len(alive) - crossing)[len(alive) - crossing])
        out.append(c)
        running &= size < c
    return tuple(out)


def simulated_t(looks: tuple[int, ...], rho: float, studies: int, seed: int = 0):
    """(studies, looks) array of the study's t at each look under no difference: per-seed N(0, 1) differences plus
    one item-set offset N(0, rho) shared by every seed of a study; t = mean / sqrt((s^2 + n rho) / n)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((studies, looks[-1]))
    offset = rng.standard_normal(studies) * math.sqrt(rho)
    sums, squares = np.cumsum(noise, axis=1), np.cumsum(noise * noise, axis=1)
    out = np.empty((studies, len(looks)))
    for k, n in enumerate(looks):
        mean = sums[:, n - 1] / n
        var = np.maximum(squares[:, n - 1] - n * mean * mean, 0.0) / (n - 1)
        out[:, k] = (offset + mean) / np.sqrt((var + n * rho) / n)
    return out


def repeated_interval(diffs, critical: float, floor_var: float = 0.0, item_var: float = 0.0):
    """mean +- critical * se for per-seed differences under the noise model (se^2 = (max(s^2, floor) + n tau^2) /
    n), either design's interval at its critical value; None for fewer than 2 differences or no variance at all
    (equal differences and no item noise known: no evidence of how far they may move)."""
    values = [float(x) for x in diffs]
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    var = max(sum((x - mean) ** 2 for x in values) / (n - 1), floor_var or 0.0) + n * (item_var or 0.0)
    if not var > 1e-30:
        return None
    half = critical * math.sqrt(var / n)
    return mean - half, mean + half


@lru_cache(maxsize=64)
def _chance_nodes(remaining: int):
    """(Z, W) grids of conditional power: Z the standardized mean of the seeds to come (normal quantile midpoints),
    W their sum of squares about their own mean in units of the per-seed variance (chi-square on remaining - 1
    degrees of freedom, quantile midpoints; 0 for one seed)."""
    import numpy as np
    from scipy.stats import chi2, norm

    z = norm.ppf((np.arange(CHANCE_GRID[0]) + 0.5) / CHANCE_GRID[0])
    w = chi2.ppf((np.arange(CHANCE_GRID[1]) + 0.5) / CHANCE_GRID[1], remaining - 1) if remaining > 1 else np.zeros(1)
    return z[None, :], w[:, None]


@lru_cache(maxsize=65536)  # a study's rounds ask again of the looks already taken
def decision_chance(
    mean: float,
    seed_var: float,
    item_var: float,
    n: int,
    max_seeds: int,
    final_critical: float,
    margin=None,
    floor_var: float = 0.0,
) -> float:
    """Conditional power: the chance the last look (max_seeds = N) decides the contrast, either side or equivalent
    within `margin`, if the seeds to come repeat what the first n show: their per-seed differences drawn from
    N(mean, seed_var) (the item variance fixed: it is estimated from many items). Both the last look's mean and its
    variance are random: with M = N - n seeds to come, Z their standardized mean and W ~ chi2(M - 1) their sum of
    squares about it (in units of seed_var),
        mean_N = mean + sqrt(M) s Z / N,   s_N^2 = s^2 ((n - 1) + W + (n / N) Z^2) / (N - 1)
    (the pooled sum of squares of all N), floored by floor_var, and the last look decides when its repeated interval
    mean_N +- c sqrt((s_N^2 + N item_var) / N) excludes 0 or lies inside (-margin, +margin). The chance is the
    average of that indicator over fixed quantile grids of Z and W (deterministic; within about 0.005 of the
    integral). seed_var: the first n seeds' variance as the decision uses it (floored)."""
    import numpy as np

    if n >= max_seeds or not math.isfinite(final_critical):
        return 0.0
    if not seed_var > 0:
        return 1.0
    big, rest = max_seeds, max_seeds - n
    z, w = _chance_nodes(rest)
    final_mean = mean + math.sqrt(rest * seed_var) / big * z
    final_var = seed_var * ((n - 1) + w + (n / big) * z * z) / (big - 1)
    half = final_critical * np.sqrt((np.maximum(final_var, floor_var) + big * item_var) / big)
    size = np.abs(final_mean)
    decided = size > half
    if margin is not None:
        decided |= size + half < margin
    return float(decided.mean())
