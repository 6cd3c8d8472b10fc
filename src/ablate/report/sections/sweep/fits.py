"""The sweep views' fits: pure functions of numpy arrays. Each returns a new JSON-ready dict with a "status" and,
when it cannot fit (or its grid limits the fit), a "note" saying why, so report.json holds what the text says.

- lr_optimum: a quadratic in log10(LR) through the best grid point and its neighbours; the vertex is the optimum
- critical_batch: McCandlish et al.'s (S/S_min - 1)(E/E_min - 1) = 1 across batch sizes, B_crit = E_min/S_min
- wsd_batch: the WSD-revised E(S) of Zhou et al. 2026, "How to Set the Batch Size for Large-Scale Pre-training?"
  (arXiv 2601.05034): B_opt where E(S) is least, B_min below which the target loss is never reached. Seed 001
  (../shared/seeds/001_6d95237916c502c2.txt) holds only the paper's abstract, which names B_min and B_opt but
  not the form of E(S): the stages fitted here were taken from the paper's full text (or a summary of it), and
  could not be checked against it offline
- power_law: L(N) = E + A N^-alpha (its least squares: stats/power_law.py, which the multipliers share)
- optimum_drift: how lr_optimum's quadratic optimum moves along a scale axis: the slope of log2(optimum) against
  log2(scale), its interval from seeds resampled in every cell and every scale's optimum refitted
"""

from __future__ import annotations

import math

import numpy as np

from ablate.report.stats.power import t_quantile
from ablate.report.stats.power_law import power_law_params

MINICPM_COEF, MINICPM_EXP = 1.2110e9, 6.2393  # MiniCPM: optimal batch in tokens = 1.2110e9 / L^6.2393 (C4 loss)
MAX_FIT_BOOT = 200  # replicates that re-read loss curves or refit by least squares cost more than a mean


def minicpm_batch_tokens(loss: float) -> float:
    return MINICPM_COEF / loss**MINICPM_EXP


def _joined(note: str, more: str) -> str:
    """A note with one more reason after it ("; "-separated)."""
    if not more:
        return note
    return (note + "; " if note else "") + more


def _window(cost: np.ndarray, width: int = 3) -> tuple[int, int]:
    """The best point and its neighbours: `width` consecutive points around the minimum, shifted inside at edges."""
    i = int(np.argmin(cost))
    lo = min(max(i - width // 2, 0), len(cost) - width)
    return lo, lo + width


def percentile_ci(samples, level: float = 0.95) -> list[float] | None:
    if len(samples) < 2:
        return None
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return [float(lo), float(hi)]


def resample_means(values: list[np.ndarray], rng: np.random.Generator, corrected: bool = False) -> np.ndarray:
    """One bootstrap replicate: each point's mean over its seeds drawn with replacement (seeds are independent
    runs; points do not share seeds, so each point is resampled on its own).

    corrected: each replicate mean's distance from the point's mean scaled by sqrt(n/(n-1)) (n seeds >= 2), so the
    replicates vary as much as the mean of n seeds does (s^2/n), not (n-1)/n of that as a plain resample of n values
    does: at 2 seeds a plain seed bootstrap is sqrt(2) too narrow (optimum_drift's interval needs the correction to
    cover; tests/test_report_drift.py)."""
    if not corrected:
        return np.array([v[rng.integers(0, len(v), len(v))].mean() for v in values])
    out = []
    for v in values:
        mean = v.mean()
        out.append(mean + math.sqrt(len(v) / (len(v) - 1)) * (v[rng.integers(0, len(v), len(v))].mean() - mean))
    return np.array(out)


# ---------------------------------------------------------------------------------------------------------------
# optimum LR


def quadratic_optimum(x: np.ndarray, cost: np.ndarray) -> dict:
    """Vertex of a quadratic through the lowest cost and its two neighbours (x = log10 LR, cost: lower is better).

    status: "vertex" (the best point is inside the grid; the vertex then lies between its neighbours), "at_most" /
    "at_least" (the best point is the grid's smallest / largest x: nothing measured beyond it, so the optimum is
    given as a bound, never as an extrapolated or edge-hugging vertex), "not_convex", "too_few"."""
    n = len(x)
    best = int(np.argmin(cost))
    out = {
        "status": "too_few",
        "x_opt": None,
        "cost_opt": None,
        "bound_x": None,
        "coef": None,
        "window": None,
        "best": best,
    }
    if n < 3:
        return out
    lo, hi = _window(cost)
    a, b, c = np.polyfit(x[lo:hi], cost[lo:hi], 2)
    out = {**out, "coef": [float(a), float(b), float(c)], "window": [lo, hi]}
    if best == 0:
        return {**out, "status": "at_most", "bound_x": float(x[0])}
    if best == n - 1:
        return {**out, "status": "at_least", "bound_x": float(x[-1])}
    if a > 0:
        return {**out, "status": "vertex", "x_opt": float(-b / (2 * a)), "cost_opt": float(c - b * b / (4 * a))}
    return {**out, "status": "not_convex"}


def _lr_fitted(lrs: np.ndarray, fit: dict, sign: float, tolerance: float) -> dict:
    """What the quadratic gives: the score (not the cost) as a quadratic in log10 LR over its window, and the
    optimum with the LRs within `tolerance` of it, or the bound, or why neither."""
    out = {
        "coef": [sign * c for c in fit["coef"]],
        "window": [float(lrs[fit["window"][0]]), float(lrs[fit["window"][1] - 1])],
    }
    if fit["status"] == "vertex":
        half = math.sqrt(tolerance * abs(fit["cost_opt"]) / fit["coef"][0])
        within = [10 ** (fit["x_opt"] - half), 10 ** (fit["x_opt"] + half)]
        beyond = bool(within[0] < lrs[0] or within[1] > lrs[-1])
        optimum = {"lr_opt": 10 ** fit["x_opt"], "value_opt": sign * fit["cost_opt"]}
        return {**out, **optimum, "within": within, "within_beyond_grid": beyond}
    if fit["status"] in ("at_most", "at_least"):
        word = "smallest" if fit["status"] == "at_most" else "largest"
        note = f"the best LR is the grid's {word}: the optimum may lie beyond it; extend the grid that way"
        return {**out, "bound_lr": 10 ** fit["bound_x"], "note": note}
    return {**out, "note": "the scores around the best LR are not convex in log10(LR): no vertex (noisy or flat)"}


def vertex_replicates(
    x: np.ndarray, values: list[np.ndarray], sign: float, n_boot: int, rng: np.random.Generator, corrected: bool = False
) -> np.ndarray:
    """(n_boot,) the vertex of quadratic_optimum refitted to seeds resampled at each point (resample_means), NaN
    where a replicate found none (its best point at the grid's edge, or not convex)."""
    out = np.full(n_boot, np.nan)
    for b in range(n_boot):
        rep = quadratic_optimum(x, sign * resample_means(values, rng, corrected))
        if rep["status"] == "vertex":
            out[b] = rep["x_opt"]
    return out


def _lr_ci(x: np.ndarray, values: list[np.ndarray], sign: float, fit: dict, n_boot: int, seed: int, note: str) -> dict:
    """Seeds resampled at each LR and refitted: the share of replicates with a vertex, and its 95% CI where the
    point estimate is a vertex (a bound has no interval: resamples that found a vertex would contradict it)."""
    reps = vertex_replicates(x, values, sign, n_boot, np.random.default_rng(seed))
    found = reps[np.isfinite(reps)]
    share = len(found) / n_boot if n_boot else None
    out = {"n_boot": n_boot, "ci_share": share}
    if fit["status"] != "vertex":
        return {**out, "note": note + f"; {100 * share:.0f}% of seed resamples put a vertex inside the grid"}
    ci = percentile_ci(found)
    return {**out, "ci": [10 ** ci[0], 10 ** ci[1]] if ci else None}


def lr_optimum(
    lrs, values_by_lr: list, lower_is_better: bool = True, n_boot: int = 1000, seed: int = 0, tolerance: float = 0.01
) -> dict:
    """Optimum LR from per-seed final scores at each LR (values_by_lr[k]: the seeds' values at lrs[k]).

    The CI resamples seeds at each LR and refits; replicates whose best LR moves to the grid's edge give no vertex
    and are counted, not used (ci_share: the share that were usable). within: the LRs whose fitted score is within
    `tolerance` (relative) of the optimum's."""
    order = np.argsort(lrs)
    lrs = np.asarray(lrs, float)[order]
    values = [np.asarray(values_by_lr[k], float) for k in order]
    sign = 1.0 if lower_is_better else -1.0  # cost: lower is better
    x = np.log10(lrs)
    means = np.array([v.mean() for v in values])
    fit = quadratic_optimum(x, sign * means)
    out = {
        "status": fit["status"],
        "lr_opt": None,
        "value_opt": None,
        "bound_lr": None,
        "best_lr": float(lrs[fit["best"]]),
        "best_value": float(means[fit["best"]]),
        "coef": None,
        "window": None,
        "within": None,
        "within_beyond_grid": None,
        "tolerance": tolerance,
        "ci": None,
        "ci_share": None,
        "n_boot": 0,
        "note": "",
    }
    if fit["status"] == "too_few":
        return {**out, "note": f"{len(lrs)} LR value(s): a quadratic optimum needs >= 3"}
    out = {**out, **_lr_fitted(lrs, fit, sign, tolerance)}
    if min(len(v) for v in values) < 2:
        return {**out, "note": _joined(out["note"], "CI: needs >= 2 seeds at every LR")}
    return {**out, **_lr_ci(x, values, sign, fit, n_boot, seed, out["note"])}


# ---------------------------------------------------------------------------------------------------------------
# the optimum's drift along a scale axis

Z_975 = 1.959963984540054  # the normal distribution's 97.5% quantile
DRIFT_MIN_SHARE = 0.9  # the least share of replicates with every scale's optimum inside its grid for a verdict


def _slope_weights(log_scale: np.ndarray) -> np.ndarray:
    """The least-squares slope as weights on the y values: slope = weights @ y."""
    centred = log_scale - log_scale.mean()
    return centred / (centred**2).sum()


def _drift_point(scale: float, fit: dict) -> dict:
    """One scale's optimum as the drift reads it (in the hyperparameter's units)."""
    at = fit["x_opt"] if fit["status"] == "vertex" else None
    bound = fit["bound_x"] if fit["status"] in ("at_most", "at_least") else None
    return {
        "scale": scale,
        "status": fit["status"],
        "optimum": None if at is None else 10**at,
        "bound": None if bound is None else 10**bound,
        "ci": None,
    }


def _drift_bound(log_scale: np.ndarray, points: list[dict]) -> dict:
    """Where some optima are bounds (the best value at the grid's edge): the slope through the vertices and the
    bounds is a bound on the slope when every bound pushes it the same way (the slope is linear in each log
    optimum, with weight (x_i - mean x) / Sxx), else nothing."""
    w = _slope_weights(log_scale)
    y, sides = [], set()
    for wi, p in zip(w, points):
        if p["status"] == "vertex":
            y.append(math.log2(p["optimum"]))
            continue
        y.append(math.log2(p["bound"]))
        up = p["status"] == "at_most"  # the optimum is at most the bound: a larger weight, a smaller slope
        if abs(wi) > 1e-12:
            sides.add("at_most" if (wi > 0) == up else "at_least")
    if len(sides) != 1:
        return {"bound_side": None, "slope_bound": None, "per_doubling_bound": None}
    slope = float(w @ np.array(y))
    return {"bound_side": sides.pop(), "slope_bound": slope, "per_doubling_bound": 2**slope}


def _seed_terms(x: np.ndarray, values: list[np.ndarray], sign: float) -> list[tuple[float, int]]:
    """The optimum's seed variance cell by cell, to first order: for each cell of the fit's window, (g^2 s^2 / n,
    n - 1), g the change of log2(optimum) per unit change of the cell's mean (numerically), s^2 its seeds' variance
    (ddof 1), n its seeds."""
    means = np.array([v.mean() for v in values])
    base = quadratic_optimum(x, sign * means)
    lo, hi = base["window"]
    eps = 1e-6 * (np.abs(means[lo:hi]).max() + 1e-12)
    terms = []
    for c in range(lo, hi):
        moved = means.copy()
        moved[c] += eps
        shifted = quadratic_optimum(x, sign * moved)
        g = 0.0 if shifted["x_opt"] is None else (shifted["x_opt"] - base["x_opt"]) / eps / math.log10(2)
        n = len(values[c])
        terms.append((g * g * float(values[c].var(ddof=1)) / n, n - 1))
    return terms


def satterthwaite(terms: list[tuple[float, int]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variance terms (variance, its df); inf where none vary."""
    total = sum(v for v, _ in terms)
    spread = sum(v * v / d for v, d in terms if d > 0)
    return math.inf if spread <= 0 else total * total / spread


def _widened(ci: list[float] | None, at: float, df: float) -> list[float] | None:
    """A percentile interval's ends moved from the estimate `at` by t(df) / z: the interval of a mean whose spread
    is estimated from df seed degrees of freedom (2 seeds: 1 per cell), not known."""
    if ci is None or not math.isfinite(df):
        return ci
    k = t_quantile(0.975, df) / Z_975
    return [at + (ci[0] - at) * k, at + (ci[1] - at) * k]


def _drift_ci(x: list, values: list, sign: float, log_scale: np.ndarray, fit: dict, n_boot: int, seed: int) -> dict:
    """Seeds resampled within every (scale, value) cell (corrected, see resample_means), every scale's optimum
    refitted, then the slope: its 95% interval over the replicates where every scale found a vertex, each scale's
    interval of its optimum over its own, and the share of replicates usable. Each percentile interval is widened
    by t(df)/z, df by Welch-Satterthwaite over the cells the optima rest on: with 2 seeds a cell's spread rests on
    one degree of freedom, and the plain percentile interval covered a zero drift in ~85% of constructed studies
    (95% nominal; tests/test_report_drift.py)."""
    rng = np.random.default_rng(seed)  # one stream through the scales: their resamples are independent
    reps = np.array([vertex_replicates(xi, vi, sign, n_boot, rng, corrected=True) for xi, vi in zip(x, values)])
    reps = reps / math.log10(2)  # log2 of the optimum
    usable = np.isfinite(reps).all(axis=0)
    w = _slope_weights(log_scale)
    terms = [_seed_terms(xi, vi, sign) for xi, vi in zip(x, values)]
    df = satterthwaite([(wi * wi * v, d) for wi, ts in zip(w, terms) for v, d in ts])
    ci = _widened(percentile_ci(w @ reps[:, usable]) if usable.any() else None, fit["slope"], df)
    y = [math.log2(p["optimum"]) for p in fit["points"]]
    point_cis = [_widened(percentile_ci(r[np.isfinite(r)]), at, satterthwaite(t)) for r, at, t in zip(reps, y, terms)]
    return {
        "ci": ci,
        "per_doubling_ci": None if ci is None else [2 ** ci[0], 2 ** ci[1]],
        "df": df if math.isfinite(df) else None,
        "ci_share": float(usable.mean()),
        "n_boot": n_boot,
        "point_cis": [None if c is None else [2 ** c[0], 2 ** c[1]] for c in point_cis],
    }


def optimum_drift(
    scales, hp_by_scale: list, values_by_scale: list, lower_is_better: bool = True, n_boot: int = 1000, seed: int = 0
) -> dict:
    """How the optimum of a hyperparameter (lr_optimum's: a quadratic in log10 of its value through the best value
    and its neighbours) moves with a scale: the least-squares slope of log2(optimum) against log2(scale), so the
    optimum moves 2**slope x per doubling of the scale. hp_by_scale[i]: the hyperparameter's values at scales[i];
    values_by_scale[i][k]: the seeds' scores at hp_by_scale[i][k].

    status: "fit" (every scale's optimum a vertex), "bounded" (some optimum is at its grid's edge: the slope
    through the vertices and those bounds is a bound on the slope where they all push it one way, never an
    estimate), "no_optimum" (a scale has no vertex: not convex, or too few values), "too_few" (one scale).
    The interval: seeds (the unit of replication) resampled within every (scale, value) cell, every scale's
    optimum refitted and the slope with them, the percentile interval widened by t(df)/z for the few seed degrees of
    freedom it rests on (_drift_ci); replicates where some optimum left its grid's interior are counted, not used
    (ci_share). verdict: "drift" (the interval excludes 0), "none" (it contains 0), null where there is
    no interval or under DRIFT_MIN_SHARE of the replicates were usable."""
    order = np.argsort(np.asarray(scales, float))
    s = np.asarray(scales, float)[order]
    sign = 1.0 if lower_is_better else -1.0
    x, values, points = [], [], []
    for i in order:
        by = np.argsort(np.asarray(hp_by_scale[i], float))
        x.append(np.log10(np.asarray(hp_by_scale[i], float)[by]))
        values.append([np.asarray(values_by_scale[i][k], float) for k in by])
        means = np.array([v.mean() for v in values[-1]])
        points.append(_drift_point(float(s[len(points)]), quadratic_optimum(x[-1], sign * means)))
    out = {
        "status": "too_few",
        "slope": None,
        "intercept": None,
        "per_doubling": None,
        "ci": None,
        "per_doubling_ci": None,
        "verdict": None,
        "bound_side": None,
        "slope_bound": None,
        "per_doubling_bound": None,
        "rmse": None,
        "df": None,
        "ci_share": None,
        "n_boot": 0,
        "points": points,
        "note": "",
    }
    if len(s) < 2 or len(set(s.tolist())) < len(s) or s[0] <= 0:
        return {**out, "note": f"{len(s)} scale(s): a drift needs >= 2 distinct positive scale values"}
    log_scale = np.log2(s)
    missing = [p for p in points if p["status"] in ("not_convex", "too_few")]
    if missing:
        where = ", ".join(f"{p['scale']:g}" for p in missing)
        return {**out, "status": "no_optimum", "note": f"no optimum at scale {where} (see its fit): no drift"}
    edges = [p for p in points if p["status"] in ("at_most", "at_least")]
    if edges:
        where = ", ".join(f"{p['scale']:g} ({p['status'].replace('_', ' ')} {p['bound']:.3g})" for p in edges)
        bound = _drift_bound(log_scale, points)
        note = (
            f"the optimum at scale {where} is at its grid's edge: the drift is bounded, not measured; extend the grid"
        )
        if bound["bound_side"] is None:
            note += " (the bounds push the slope both ways: no bound)"
        return {**out, **bound, "status": "bounded", "note": note}
    y = np.log2([p["optimum"] for p in points])
    slope = float(_slope_weights(log_scale) @ y)
    intercept = float(y.mean() - slope * log_scale.mean())
    out = {**out, "status": "fit", "slope": slope, "intercept": intercept, "per_doubling": 2**slope}
    if len(s) >= 3:
        out["rmse"] = float(np.sqrt(np.mean((intercept + slope * log_scale - y) ** 2)))
    else:
        out["note"] = (
            "two scales: the line through two optima; its interval is the seeds', but whether the optimum moves as "
            "a power of the scale needs >= 3"
        )
    if n_boot < 1 or min(len(v) for vs in values for v in vs) < 2:
        return {**out, "note": _joined(out["note"], "interval: needs >= 2 seeds in every cell")}
    boot = _drift_ci(x, values, sign, log_scale, out, n_boot, seed)
    points = [{**p, "ci": ci} for p, ci in zip(points, boot.pop("point_cis"))]
    out = {**out, **boot, "points": points}
    if out["ci"] is None or out["ci_share"] < DRIFT_MIN_SHARE:
        note = (
            f"only {out['ci_share']:.0%} of seed resamples kept every scale's optimum inside its grid: no verdict "
            f"(the interval would rest on the others)"
        )
        return {**out, "note": _joined(out["note"], note)}
    return {**out, "verdict": "drift" if out["ci"][0] > 0 or out["ci"][1] < 0 else "none"}


# ---------------------------------------------------------------------------------------------------------------
# batch size: steps S and tokens E to reach one target loss, one point per batch size


def critical_batch(tokens_per_step, steps) -> dict:
    """Fit (S/S_min - 1)(E/E_min - 1) = 1 with E = B*S (B in tokens per step), i.e. S = S_min + E_min/B.

    Linear in (S_min, E_min); each equation is divided by its S so every batch size weighs by relative error."""
    b, s = np.asarray(tokens_per_step, float), np.asarray(steps, float)
    out = {"status": "too_few", "s_min": None, "e_min": None, "b_crit": None, "rel_rmse": None, "note": ""}
    if len(b) < 3:
        return {**out, "note": f"{len(b)} batch size(s) reached this loss: the hyperbola needs >= 3"}
    (s_min, e_min), *_ = np.linalg.lstsq(np.column_stack([1 / s, 1 / (b * s)]), np.ones_like(s), rcond=None)
    pred = s_min + e_min / b
    out = {**out, "rel_rmse": float(np.sqrt(np.mean(((pred - s) / s) ** 2)))}
    if s_min <= 0:
        note = "larger batches reached this loss in fewer tokens (S_min <= 0): no critical batch; see the WSD relation"
        return {**out, "status": "no_tradeoff", "note": note}
    if e_min <= 0:
        return {**out, "status": "no_tradeoff", "note": "larger batches did not take fewer steps (E_min <= 0)"}
    return {**out, "status": "fit", "s_min": float(s_min), "e_min": float(e_min), "b_crit": float(e_min / s_min)}


# Three batch sizes around the vertex spanning this factor or more: B_opt is exact only if all three lie in E(S)'s
# quadratic stage. Measured on the synthetic WSD E(S) of tests/test_report_sweeps.py (known constants; its quadratic
# stage spans a factor 2.1 in batch size) over every placement of geometric grids: batch sizes a factor 2 apart
# (powers of 2) put B_opt 10% to more than 100% low, a factor 1.26 apart within 0.4%.
COARSE_SPAN = 2.0
COARSE_NOTE = (
    "the 3 batch sizes around the vertex span a factor {span:.2g}: B_opt is exact only if E(S) is "
    "quadratic over all three (on a synthetic WSD E(S), batch sizes a factor 2 apart put it 10% to over "
    "100% low; 1.26 apart, within 0.4%); add batch sizes between them"
)


def _wsd_vertex(fit: dict, b: np.ndarray, span: float) -> dict:
    """B_opt from the quadratic stage through the most token-efficient batch size and its two neighbours (b: the
    batch sizes, largest first): the vertex, a bound at the grid's edge, or why neither."""
    if fit["status"] == "vertex" and fit["cost_opt"] <= 0:  # three points too far apart for one quadratic stage
        note = (
            f"the quadratic through the 3 batch sizes around the minimum (a factor {span:.2g} apart) bottoms out "
            f"at E <= 0: no B_opt; add batch sizes between them"
        )
        return {"status": "not_convex", "note": note}
    if fit["status"] == "vertex":
        vertex = {"status": "vertex", "s_opt": fit["x_opt"], "e_min": fit["cost_opt"]}
        note = COARSE_NOTE.format(span=span) if span >= COARSE_SPAN else ""
        return {**vertex, "b_opt": fit["cost_opt"] / fit["x_opt"], "note": note}
    if fit["status"] == "at_most":  # fewest tokens at the fewest steps: the largest batch tried, or larger
        note = "fewest tokens at the largest batch tried: B_opt is at least that"
        return {"status": "at_least", "bound_b": float(b[0]), "note": note}
    if fit["status"] == "at_least":
        note = "fewest tokens at the smallest batch tried: B_opt is at most that"
        return {"status": "at_most", "bound_b": float(b[-1]), "note": note}
    return {"status": "not_convex", "note": "E(S) is not convex around its minimum: no vertex"}


def _wsd_linear(s: np.ndarray, e: np.ndarray, end: int) -> tuple[dict | None, float | None, str]:
    """B_min = A1 of the linear stage E = A1 S + A0, fitted to the points past the quadratic window (from `end`):
    (the line, B_min, why there is none)."""
    past = np.arange(len(s)) >= end
    if past.sum() < 2:
        return None, None, "B_min fit: needs >= 2 batch sizes smaller than the quadratic stage's three"
    a1, a0 = np.polyfit(s[past], e[past], 1)
    linear = {"a1": float(a1), "a0": float(a0), "n": int(past.sum())}
    if a1 > 0 and a0 > 0:
        return linear, float(a1), ""
    return (
        linear,
        None,
        "the points past the quadratic stage do not approach a line E = A1 S + A0 with A0 > 0: no B_min",
    )


def wsd_batch(tokens_per_step, steps) -> dict:
    """The WSD-revised E(S) of Zhou et al. 2026 (arXiv 2601.05034; the stages as taken from its full text or a
    summary, not from seed 001, which is its abstract): E(S) falls as 1/(S - S_min) near S_min, is quadratic
    C (S - S_opt)^2 + E_min around its minimum, and grows linearly A1 S + A0 as S -> infinity.
    - B_opt = E_min / S_opt: the batch size that reaches the loss on the fewest tokens (the quadratic stage's
      vertex, fitted to the most token-efficient batch size and its two neighbours; a bound when that batch size
      is the grid's largest or smallest; a note when those three span a factor >= COARSE_SPAN, see there);
    - B_min: a run of batch B moves along E = B S, so it reaches the loss only if B > E(S)/S somewhere; in the linear
      stage E/S -> A1 from above (A0 > 0), so B_min = A1, fitted to the points past the quadratic window (>= 2).
    The inverse stage near S_min needs several batch sizes beyond B_opt and is not fitted."""
    b, s = np.asarray(tokens_per_step, float), np.asarray(steps, float)
    order = np.argsort(s)  # the largest batch (fewest steps) first
    b, s = b[order], s[order]
    e = b * s
    out = {
        "status": "too_few",
        "s_opt": None,
        "e_min": None,
        "b_opt": None,
        "bound_b": None,
        "most_efficient_b": float(b[int(np.argmin(e))]),
        "coef": None,
        "window_s": None,
        "window_span": None,
        "b_min": None,
        "linear": None,
        "note": "",
    }
    if len(b) < 3:
        return {**out, "note": f"{len(b)} batch size(s) reached this loss: the quadratic stage needs >= 3"}
    fit = quadratic_optimum(s, e)
    lo, hi = fit["window"]
    span = float(b[lo] / b[hi - 1])  # the window's largest batch over its smallest
    window = {"coef": fit["coef"], "window_s": [float(s[lo]), float(s[hi - 1])], "window_span": span}
    out = {**out, **window, **_wsd_vertex(fit, b, span)}
    linear, b_min, why = _wsd_linear(s, e, hi)
    return {**out, "linear": linear, "b_min": b_min, "note": _joined(out["note"], why)}


# ---------------------------------------------------------------------------------------------------------------
# model size


def power_law(n, loss, values_by_size: list | None = None, n_boot: int = 200, seed: int = 0) -> dict:
    """Fit L(N) = E + A N^-alpha (least squares on L). values_by_size[k]: the per-seed losses behind loss[k], for
    a bootstrap CI of E, A and alpha (seeds resampled at each size, refit)."""
    n, loss = np.asarray(n, float), np.asarray(loss, float)
    out = {"status": "too_few", "E": None, "A": None, "alpha": None, "ci": None, "n_boot": 0, "rmse": None, "note": ""}
    if len(n) < 3 or len(set(n.tolist())) < 3:
        return {**out, "note": f"{len(set(n.tolist()))} model size(s): L(N) = E + A N^-alpha needs >= 3"}
    params = power_law_params(n, loss)
    if params is None:
        return {**out, "status": "not_decreasing", "note": "the loss does not fall with model size: no power law"}
    e, log_a, alpha = params
    rmse = float(np.sqrt(np.mean((e + np.exp(log_a - alpha * np.log(n)) - loss) ** 2)))
    out = {**out, "status": "fit", "E": float(e), "A": float(math.exp(log_a)), "alpha": float(alpha), "rmse": rmse}
    if len(n) == 3:
        out = {**out, "note": "3 sizes for 3 parameters: the curve passes through them (the form is not tested)"}
    if values_by_size is None or min(len(v) for v in values_by_size) < 2:
        return {**out, "note": _joined(out["note"], "CI: needs >= 2 seeds at every size")}
    rng = np.random.default_rng(seed)
    reps = [
        p
        for _ in range(n_boot)
        if (p := power_law_params(n, resample_means([np.asarray(v, float) for v in values_by_size], rng))) is not None
    ]
    if not reps:
        return {**out, "n_boot": n_boot}
    reps = np.array(reps)
    ci = {"E": percentile_ci(reps[:, 0]), "A": percentile_ci(np.exp(reps[:, 1])), "alpha": percentile_ci(reps[:, 2])}
    return {**out, "ci": ci, "n_boot": n_boot}
