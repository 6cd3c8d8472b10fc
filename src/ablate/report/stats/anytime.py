"""The anytime-valid design of an adaptive study (DecisionRule(design="anytime")): confidence sequences from the
safe t-test, valid whenever the study stops and however far it is extended.

Method: the anytime-valid t-test built from e-values, the group-invariant ("safe") t-test of Perez-Ortiz, Lardy,
de Heide and Grunwald (2022, "E-statistics, group invariance and anytime valid testing", arXiv:2208.07610). For n
paired per-seed differences with mean m and variance s^2, t = (m - mu0) / sqrt(s^2 / n) on nu = n - 1 degrees of
freedom. The Bayes factor of t with the right-Haar prior on the scale and a normal prior N(0, g) on the
standardized effect mu / sigma is (Gonen, Johnson, Lu and Westfall 2005, "The Bayesian two-sample t test")

    BF_g(t) = (1 + n g)^(-1/2) * ((1 + t^2 / nu) / (1 + t^2 / (nu (1 + n g))))^((nu + 1) / 2),

a test martingale in n >= 2 under mu = mu0 on the filtration of the scale-invariant statistic (the paper's Theorem
for group-invariant e-processes). An average of test martingales is one, so the e-value used is the mean over
g in MIXTURE_G = (1, 10, 100, 1000): the large g let a huge effect decide at 3 seeds (at n = 3, BF_g's supremum over
t is 1 + 3 g, so the mixture's is 834), the small ones keep power for moderate effects at more seeds.

Confidence sequence: {mu0 : E_n(mu0) < 1 / alpha}. BF_g grows with |t|, so this is m +- t* sqrt(s^2 / n), t* the
solution of E(t*) = 1 / alpha (unbounded where the supremum at n stays below 1 / alpha: at 2 seeds always, at 3
seeds where alpha <= 1/834). By Ville's inequality, P(some n has E_n(mu_true) >= 1 / alpha) <= alpha: every
interval of the sequence covers the truth at once with probability >= 1 - alpha, whatever the stopping rule.
The interval a study reports is the running intersection over its prefixes (n = 2, 3, ...), which keeps the
guarantee and never lets a decision made at one round be taken back at a later one.

Across contrasts: Bonferroni (sequential.py); each sequence is time-uniform, so with probability >= 1 - alpha every
interval of every contrast covers its true difference at every round.
"""

from __future__ import annotations

import math
from functools import lru_cache

from ablate.report.stats.group_sequential import repeated_interval

MIXTURE_G = (1.0, 10.0, 100.0, 1000.0)  # prior variances of the standardized effect, equally weighted


def log_bayes_factor(t: float, n: int, g: float) -> float:
    """log BF_g(t) for n >= 2 observations (formula in the module docstring)."""
    nu = n - 1
    return -0.5 * math.log1p(n * g) + (nu + 1) / 2 * (math.log1p(t * t / nu) - math.log1p(t * t / (nu * (1 + n * g))))


def _log_mean_exp(logs: list[float]) -> float:
    top = max(logs)  # in logs: e-values at many seeds overflow a float
    return top + math.log(sum(math.exp(x - top) for x in logs) / len(logs))


def log_e_value(t: float, n: int) -> float:
    """log of the mixture e-value: the mean of BF_g(t) over MIXTURE_G."""
    return _log_mean_exp([log_bayes_factor(t, n, g) for g in MIXTURE_G])


def e_value(t: float, n: int) -> float:
    return math.exp(log_e_value(t, n))


def log_e_value_sup(n: int) -> float:
    """log of the largest e-value n observations can give (|t| -> infinity): the mean of (1 + n g)^((n - 1) / 2)."""
    return _log_mean_exp([(n - 1) / 2 * math.log1p(n * g) for g in MIXTURE_G])


def e_value_sup(n: int) -> float:
    return math.exp(log_e_value_sup(n))


@lru_cache(maxsize=4096)
def critical_t(n: int, alpha: float) -> float:
    """t* with e_value(t*, n) = 1 / alpha: the interval's half-width in standard errors; infinite where no t
    reaches 1 / alpha at n."""
    from scipy.optimize import brentq

    log_threshold = -math.log(alpha)
    if n < 2 or log_e_value_sup(n) <= log_threshold:
        return math.inf
    hi = 1.0
    while log_e_value(hi, n) < log_threshold:
        hi *= 2
    return brentq(lambda t: log_e_value(t, n) - log_threshold, 0.0, hi, xtol=1e-10, rtol=1e-12)


def confidence_sequence(
    diffs, alpha: float, floor_var: float = 0.0, item_var: float = 0.0
) -> tuple[float, float] | None:
    """The interval for the mean of `diffs` (per-seed differences, in seed order) at n = len(diffs), one member of a
    sequence covering the mean at every n at once with probability >= 1 - alpha (alpha: this sequence's own level,
    the study's alpha / K). floor_var: the fresh answer noise of one run-level difference (floors the per-seed
    variance); item_var: the persistent item-set variance of the mean difference, which seeds do not average away
    (the mean's variance is max(s^2, floor_var) / n + item_var). None for fewer than 2 differences or no variance
    at all; (-inf, inf) where n cannot reach 1 / alpha."""
    n = len(diffs)
    return repeated_interval(diffs, critical_t(n, alpha), floor_var, item_var) if n >= 2 else None


def running_interval(prefixes: list[tuple], alpha: float) -> tuple[float, float] | None:
    """The intersection of the sequence's intervals over prefixes [(diffs of the first n seeds, floor_var,
    item_var), ...] (n rising; item_var may be left out: 0): still covering at every n with probability >= 1 -
    alpha, and never widening. An empty intersection (possible only where coverage failed) leaves the newest
    interval."""
    out = None
    for diffs, *noise in prefixes:
        now = confidence_sequence(diffs, alpha, *noise)
        if now is None:
            continue
        both = now if out is None else (max(out[0], now[0]), min(out[1], now[1]))
        out = both if both[0] <= both[1] else now
    return out
