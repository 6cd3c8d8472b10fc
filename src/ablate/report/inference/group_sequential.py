"""The group-sequential design of an adaptive study: alpha spent over looks fixed before round 1.

An adaptive study looks after each round, at n paired seeds, up to the max_seeds N its rule recorded. The
anytime-valid design (sequential.py) pays for stopping at any time; this one uses what the rule fixed in advance.

Information. The noise model of the fixed report (stats.seed_test) puts the mean difference's variance at
sigma^2 / n + tau^2: a per-seed part that seeds average away and an item-set part (the same validation documents or
task items on every seed) that they do not. The information at n seeds is its inverse, so the information fraction
is I(n) / I(N) = (1/N + rho) / (1/n + rho), rho = tau^2 / sigma^2 the item-set share. rho is not known before the
study: tau^2 is (from the items), sigma^2 only through the seeds' s^2 on n - 1 degrees of freedom. A schedule and
boundaries read off an estimated rho inflate the error: at 2 degrees of freedom a small s^2 (which happens) claims a
large share, lighter-tailed boundaries and a larger |t| at once (measured: a 6-variant A/A with tau^2 = 0.1 sigma^2
made a wrong decision in 12% of studies at alpha 0.05, the share from an 80% upper bound on sigma^2; with rho known,
4.3%). So the schedule is the seeds' own,
fractions n / N (rho = 0), and the boundaries are calibrated for the t of seeds alone. That is conservative when
there is an item term: the known n tau^2 in the t's denominator only lightens its tails (scripts/simulate_sequential.py
--designs measures both the error and the power it costs).

Spending (Lan and DeMets 1983): the cumulative error allowed by fraction f, two-sided, for a contrast's alpha:
  pocock           alpha * ln(1 + (e - 1) f)                          spends early: decides a clear loser at 3 seeds
  obrien_fleming   2 - 2 Phi(z_(1 - alpha / 2) / sqrt(f))             spends late: the most power at the last look
  hsd:G            alpha * (1 - exp(-G f)) / (1 - exp(-G))            Hwang, Shih and DeCani; G = 1 near pocock, -4
                                                                      near obrien_fleming
Spending handles looks that were not planned: a skipped look, a round that trained fewer seeds, a stop for budget
keep the guarantee (each look spends what its own fraction allows). Raising N after results changes the fractions of
looks already taken, and so is refused (sequential.voids_guarantee).

Boundaries. The study's statistic is a t: t_n = mean / sqrt((s^2 + n tau^2) / n) on n - 1 degrees of freedom.
Boundaries for z converted at the same nominal p inflate alpha by 16-22% at 2-7 degrees of freedom, so the critical
values c_k are calibrated for that t by simulation under no difference (SIMULATED_STUDIES studies of per-seed normal
noise): c_k is the |t_k| that the simulated studies still running at look k exceed with probability spent(f_k) -
spent(f_(k-1)). Seeded, and cached by everything they depend on: the looks, N, alpha (the contrast's), the spending
(and rho, 0 in every decision; the simulation takes others to measure what an item term does).

Repeated confidence intervals: mean_k +- c_k se_k. The t is pivotal in the true difference, so with probability
>= 1 - alpha every interval of every look covers it at once: a decision read from them (0 excluded: the better
side; inside +-margin: equivalent) is wrong with probability <= alpha, at whatever look the study stops.

Futility (non-binding): a contrast whose chance of being decided by N seeds, if the difference is what it seems
now (conditional power), is below a threshold closes as "undecidable within N seeds". The boundaries never assume
the rule is followed (they are computed as if every study ran to its last look), so the error guarantee holds
whether or not it is: closing early only gives up power.
"""

from __future__ import annotations

import math
from functools import lru_cache

SPENDINGS = ("pocock", "obrien_fleming", "hsd:G (G a number, e.g. hsd:-2)")
SIMULATED_STUDIES = 200_000  # under no difference; c_k's Monte Carlo error is a few percent at alpha / K = 0.003


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


def boundaries(looks, max_seeds: int, alpha: float, spending: str, rho: float = 0.0) -> tuple[float, ...]:
    """The critical |t| at each look (seeds paired at it: rising, each >= 2 and <= max_seeds); inf where a look may
    not decide (nothing left to spend, or 2 seeds)."""
    looks = tuple(int(n) for n in looks)
    if any(b <= a for a, b in zip(looks, looks[1:])) or not looks or looks[0] < 2 or looks[-1] > max_seeds:
        raise ValueError(f"looks {looks}: rising seed counts from 2 to max_seeds={max_seeds}")
    return _boundaries(looks, max_seeds, float(alpha), spending, float(rho))


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


def decision_chance(
    mean: float, seed_var: float, item_var: float, n: int, max_seeds: int, final_critical: float, margin=None
) -> float:
    """Conditional power: the chance the last look (max_seeds) decides the contrast, either side or equivalent, if
    the true difference is the current estimate. The last look's mean is (n mean + (N - n) D) / N, D the mean of the
    seeds to come: normal around the same difference (they share its item set) with variance seed_var / (N - n)."""
    if n >= max_seeds or not math.isfinite(final_critical):
        return 0.0
    spread = math.sqrt((max_seeds - n) * seed_var) / max_seeds
    half = final_critical * math.sqrt(seed_var / max_seeds + item_var)
    if spread <= 0:
        return 1.0
    chance = _normal_cdf((mean - half) / spread) + _normal_cdf((-mean - half) / spread)
    if margin is not None and margin > half:  # equivalence: the whole interval inside (-margin, +margin)
        chance += _normal_cdf((margin - half - mean) / spread) - _normal_cdf((-margin + half - mean) / spread)
    return min(1.0, chance)
