"""The intervals of compute multipliers (estimate.py) and of the baseline's fitted curve, and a variant's trend across
rungs.

Interval (level 0.9). A delta-method t interval on log M. log M is a smooth function of the cells' mean losses
(the baseline points' through the fitted parameters, d theta / d ybar = (J'J)^-1 J' at the fit, and the variant's
directly), so it is linearized to sum_j h_j ybar_j. When every cell holds the same seeds, each seed's linearized
value z_s = sum_j h_j y_js is formed and Var(log M) = var(z) / n with n - 1 degrees of freedom: seeds are the unit
of replication, and a seed's compute points (one run, several endpoints) and the variant run sharing its seed are
taken together, whatever their correlation. Otherwise the cells are taken as independent, Var = sum_j h_j^2 s_j^2
/ n_j, on min(n_j) - 1 degrees of freedom (conservative: Satterthwaite's would be larger). The validation set is the
same for every seed, so a persistent item term does not shrink with seeds. Where every point has its per-item
validation losses (`items`), the (seeds, items) matrix of linearized per-item values sum_j h_j y_jsi is split as
every paired difference of the report is (stats/noise.paired_noise: seed variance floored by the fresh noise,
the persistent item variance, Satterthwaite df); a point's optional `item_var` (a known variance of its mean loss
from the finite validation set) is added as sum_j h_j^2 item_var_j.
A cluster bootstrap resampling whole seeds (bootstrap_interval) checks it where >= 5 seeds; at 3 seeds there are
only 10 distinct resamples, and it is not given.

Trend across rungs: at 2 rungs, the ratio M_2 / M_1 and its interval (log difference, variances added, the smaller
df); at >= 3, the least squares slope of log M on log C_v, its variance sum_r c_r^2 Var(log M_r) (c_r the slope's
coefficients), its interval on the smallest df. Equal weights, not 1 / Var(log M_r): weights estimated from a few
seeds made the A/A false-positive rate 0.125 at 5 seeds (nominal 0.10). `established` only where the interval
excludes no change (slope 0, ratio 1).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from ablate.report.sections.multipliers.baseline_curve import Cell, Curve
from ablate.report.stats.noise import paired_noise

LEVEL = 0.9


def t_quantile(level: float, df: float) -> float:
    return float(stats.t.ppf((1 + level) / 2, df))


def _linearized(curve, variant: Cell) -> tuple[float, list[Cell], list[float]]:
    """log M and its linearization: the cells it reads (the baseline's inputs, then the variant's) and d log M /
    d (each cell's mean)."""
    loss = variant.mean
    by_points, by_loss = curve.gradients(loss)
    return curve.log_compute_for(loss) - math.log(variant.flops), [*curve.inputs, variant], [*by_points, by_loss]


def linear_variance(cells: list[Cell], weights: list[float]) -> dict:
    """The variance of sum_j w_j ybar_j over seeds (see the module docstring), its df, whether seeds were paired, and
    the persistent item term where per-item losses exist; `var` None where a cell has < 2 seeds."""
    out = {"var": None, "df": None, "paired": False}
    if min(c.n for c in cells) < 2:
        return out
    item = sum(w * w * c.item_var for w, c in zip(weights, cells))
    if len({frozenset(c.losses) for c in cells}) == 1:  # every cell holds the same seeds: the seed is the unit
        seeds = list(cells[-1].losses)
        z = np.array([sum(w * c.losses[s] for w, c in zip(weights, cells)) for s in seeds])
        out.update(var=float(np.var(z, ddof=1)) / len(z) + item, df=len(z) - 1, paired=True)
        if all(c.items is not None for c in cells) and len({c.items[s].size for c in cells for s in seeds}) == 1:
            # the validation set is one fixed sample: the persistent item term, the report's noise model
            per_item = sum(w * np.stack([c.items[s] for s in seeds]) for w, c in zip(weights, cells))
            noise = paired_noise(z, per_item)
            out.update(var=noise.seed_var / len(z) + noise.item_var + item, df=noise.df, item_var=noise.item_var)
    else:
        seed_var = sum(w * w * c.var / c.n for w, c in zip(weights, cells))
        out.update(var=seed_var + item, df=min(c.n for c in cells) - 1)
    return out


def log_multiplier(curve, variant: Cell) -> dict:
    """log M at one variant cell against one baseline curve (a Curve or an Interpolation), with its delta-method
    variance and df (see the module docstring); `var` None where a cell has < 2 seeds."""
    log_m, cells, weights = _linearized(curve, variant)
    return {"log_m": log_m, **linear_variance(cells, weights)}


def log_ratio(curve, variant: Cell, other: Cell) -> dict:
    """log (M at `other` / M at `variant`), two cells of one arm at one rung read from one curve: one linear
    function of every cell's mean, so its variance comes the same way as log M's (seeds the unit where every cell
    holds the same seeds)."""
    found: dict[int, list] = {}
    terms = []
    for sign, cell in ((-1.0, variant), (1.0, other)):
        log_m, cells, weights = _linearized(curve, cell)
        terms.append(sign * log_m)
        for c, w in zip(cells, weights):
            found.setdefault(id(c), [c, 0.0])[1] += sign * w
    cells, weights = [c for c, _ in found.values()], [w for _, w in found.values()]
    return {"log_m": sum(terms), **linear_variance(cells, weights)}


def multiplier_interval(est: dict, level: float) -> list[float] | None:
    if est["var"] is None:
        return None
    half = t_quantile(level, est["df"]) * math.sqrt(est["var"])
    return [math.exp(est["log_m"] - half), math.exp(est["log_m"] + half)]


def curve_band(curve: Curve, flops, level: float = LEVEL) -> dict:
    """The fitted loss at each of `flops` with its pointwise delta-method interval (the same noise model as
    log_multiplier: each seed's linearized value where every point holds the same seeds, else independent points).
    low/high are None where a point has < 2 seeds."""
    flops = np.asarray(flops, float)
    fitted = curve.loss_at(flops)
    u = np.log(flops / curve.c0)
    core = np.exp(curve.log_a - curve.alpha * u)
    by_theta = np.column_stack([np.ones_like(u), core, -u * core])  # d L / d (E, log a, alpha)
    weights = by_theta @ curve.dtheta  # (flops, points): d L(C) / d point means
    out = {"flops": flops.tolist(), "loss": fitted.tolist(), "low": None, "high": None}
    cells = curve.inputs
    if min(c.n for c in cells) < 2:
        return out
    if len({frozenset(c.losses) for c in cells}) == 1:
        seeds = list(cells[0].losses)
        y = np.array([[c.losses[s] for c in cells] for s in seeds])  # (seeds, points)
        var = np.var(y @ weights.T, axis=0, ddof=1) / len(seeds)
        df = len(seeds) - 1
    else:
        var = (weights**2) @ np.array([c.var / c.n for c in cells])
        df = min(c.n for c in cells) - 1
    half = t_quantile(level, df) * np.sqrt(var)
    out.update(low=(fitted - half).tolist(), high=(fitted + half).tolist())
    return out


def trend(rows: list[dict], level: float = LEVEL) -> dict:
    """How one variant's data multiplier changes across rungs (one row per rung: its largest-flops cell with an
    interval): the ratio at 2 rungs, the least squares slope of log M on log flops at >= 3 (the module docstring)."""
    by_rung: dict = {}
    for r in rows:
        if r["log_se"] is not None and (r["rung"] not in by_rung or r["flops"] > by_rung[r["rung"]]["flops"]):
            by_rung[r["rung"]] = r
    out = {"slope": None, "ratio": None, "interval": None, "established": False, "rungs": len(by_rung), "note": ""}
    dropped = len({r["rung"] for r in rows}) - len(by_rung)
    if dropped:
        out["note"] = f"{dropped} rung(s) without a multiplier and its interval left out; "
    if len(by_rung) < 2:
        out["note"] += f"{len(by_rung)} rung(s) with a multiplier: no trend"
        return out
    used = sorted(by_rung.values(), key=lambda r: r["flops"])
    y = np.array([r["log_multiplier"] for r in used])
    var = np.array([r["log_se"] ** 2 for r in used])
    df = min(r["df"] for r in used)
    t = t_quantile(level, df)
    if len(used) == 2:
        d, se = float(y[1] - y[0]), math.sqrt(var.sum())
        out.update(ratio=math.exp(d), interval=[math.exp(d - t * se), math.exp(d + t * se)])
        out["established"] = bool(out["interval"][0] > 1 or out["interval"][1] < 1)
        out["note"] += "M at the larger rung over M at the smaller, on the smaller df"
        return out
    x = np.log([r["flops"] for r in used])
    # Equal weights in the slope, each rung's own variance in its variance: weights 1 / Var(log M) estimated from
    # 2 to 4 seed df favour the rungs whose spread came out small, and the A/A false-positive rate of that weighted
    # slope ran 0.125 +- 0.023 at 5 seeds (nominal 0.10); this one 0.093 (5 seeds) and 0.047 (3).
    xc = x - x.mean()
    coef = xc / float(xc @ xc)
    slope, se = float(coef @ y), math.sqrt(float(coef**2 @ var))
    out.update(slope=slope, interval=[slope - t * se, slope + t * se])
    out["established"] = bool(out["interval"][0] > 0 or out["interval"][1] < 0)
    out["note"] += "slope of log M per unit log compute (least squares; each rung's variance propagated; smallest df)"
    return out
