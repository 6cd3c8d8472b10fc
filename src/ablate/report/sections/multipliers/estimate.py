"""Effects in the currency of compute: a variant's compute multiplier on a ladder of model sizes (rungs).

At one rung the baseline is trained to several compute budgets (its compute points, each an annealed endpoint,
each with several seeds). Its curve L(C) = E + A C^-alpha is fitted through the points' mean losses (least squares
on L, stats/power_law.power_law_params) and inverted: C_base(L) = (A / (L - E))^(1/alpha). A variant that used C_v
flops and reached mean loss L_v is worth M = C_base(L_v) / C_v: the baseline would need M times the compute for that
loss.

- data multiplier: against the baseline's curve at the same rung (same model size, more or less data).
- frontier multiplier (>= 3 rungs): against the baseline's envelope across sizes, the least compute any rung's
  baseline needs for L_v (the envelope of decreasing curves inverted is the minimum of the inverses), taken over the
  rungs whose compute points bracket L_v. Its interval is the data interval at the rung that attains the minimum:
  the choice of that rung is not accounted for (a stated simplification).
- wall-clock multiplier: M times the variant's measured FLOP/s over the baseline's, this machine's numbers (a variant
  that needs fewer flops but runs slower is worth less in seconds).

Identifiability. With fewer than 4 baseline compute points E is not identifiable (3 points and 3 parameters fit
exactly, any E): E must be pinned (a given value, or "shared": one E profiled across the rungs' pinned fits, its
estimation error then carried into every interval by the joint linearization, carry_shared_e). The
multiplier is then recomputed over a stated E range (default 0 to 0.8 of the lowest baseline loss: any floor a
reader would believe, not a neighbourhood of the fitted one) and flagged when it moves more than its interval's
half-width. A variant for which the baseline would need more compute than its largest budget (the inverted curve,
not the points' mean losses: a fitted curve can cross the largest budget above or below that point's mean) gets no
number (`extrapolated: true`): only a bound, M > C_max / C_v (or M < C_min / C_v), with the span of the budgets.
Fewer than 2 seeds in any cell: a number, no interval. One rung: no trend.

Is the curve the right one? Each rung's fit is tested, and where it fails M is read from a local quadratic instead
(baseline_curve.py: check_form, reader_for; each row says which it was read from, `read_from`, and why).

M at several budgets of one arm and rung: each row's `budget_ratios` gives M at every other budget over its own,
with the interval of that ratio (log_ratio: one linear function of every cell's mean, seeds the unit as for log M),
so that a change of M with the budget is read only where that interval excludes 1.

Interval (level 0.9). A delta-method t interval on log M. log M is a smooth function of the cells' mean losses
(the baseline points' through the fitted parameters, d theta / d ybar = (J'J)^-1 J' at the fit, and the variant's
directly), so it is linearized to sum_j h_j ybar_j. When every cell holds the same seeds, each seed's linearized
value z_s = sum_j h_j y_js is formed and Var(log M) = var(z) / n with n - 1 degrees of freedom: seeds are the unit
of replication, and a seed's compute points (one run, several endpoints) and the variant run sharing its seed are
taken together, whatever their correlation. Otherwise the cells are taken as independent, Var = sum_j h_j^2 s_j^2
/ n_j, on min(n_j) - 1 degrees of freedom (conservative: Satterthwaite's would be larger). The validation set is the
same for every seed, so a persistent item term does not shrink with seeds. Where every point has its per-item
validation losses (`items`), the (seeds, items) matrix of linearized per-item values sum_j h_j y_jsi is split as
every paired difference of the report is (stats/stats.paired_noise: seed variance floored by the fresh noise,
the persistent item variance, Satterthwaite df); a point's optional `item_var` (a known variance of its mean loss
from the finite validation set) is added as sum_j h_j^2 item_var_j.
A cluster bootstrap resampling whole seeds (bootstrap_interval) checks it where >= 5 seeds; at 3 seeds there are
only 10 distinct resamples, and it is not given.

Trend across rungs: at 2 rungs, the ratio M_2 / M_1 and its interval (log difference, variances added, the smaller
df); at >= 3, the least squares slope of log M on log C_v, its variance sum_r c_r^2 Var(log M_r) (c_r the slope's
coefficients), its interval on the smallest df. Equal weights, not 1 / Var(log M_r): weights estimated from a few
seeds made the A/A false-positive rate 0.125 at 5 seeds (nominal 0.10). `established` only where the interval
excludes no change (slope 0, ratio 1).

Measured on constructed ladders (scripts/simulate_multipliers.py: variants on the baseline's curve at m times the
compute, seed sd 0.01 in loss, 3 rungs, 200 ladders a cell): the nominal 90% interval covered the planted m
(1.0, 1.3, 2.0) in 0.88 to 0.91 of rows (MC se 0.012) at 3 and 5 seeds, E pinned at its true value (3 points)
and free (4 points); a planted 1.0 was called a gain in 0.04 to 0.06 of rows (nominal 0.05); the A/A trend was
established in 0.03 to 0.08 of ladders (nominal 0.10), shrinks of 2.0, 1.5, 1.2 and 1.3, 1.15, 1.0 in all of
them. The report's default for 0.5, 1 and 2x points, one E shared across the rungs and carried: coverage 0.877 to
0.920, a planted 1.0 called a gain in 0.035 to 0.052 of rows, the A/A trend established in 0.030 to 0.045 (held as
if known instead: coverage 0.868 to 0.931, gains up to 0.083). The seed bootstrap at 5 seeds covered in 0.64 to
0.80 (four runs of 25 ladders, se ~0.09): with 5 seeds a percentile interval is too narrow (no t correction,
variance shrunk by (n - 1) / n); it is a check, not the interval. With E pinned away
from its true value, M is biased: that is what the sensitivity check reports. These figures predate the
lack-of-fit fallback; since, on the same straight ladders 5-26% of rows read M from the local quadratic, and the
default's coverage at m = 1.0 and 1.3 ran 0.85-0.91 (100 ladders a cell, docs/reports.md's curvature table).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable

import numpy as np
from scipy import optimize, stats

from ablate.report.sections.multipliers.baseline_curve import (
    EDGE_SHARE,
    Cell,
    Curve,
    Point,
    check_form,
    fit_curve,
    group_cells,
    lof_pool,
    reader_for,
)
from ablate.report.stats.stats import paired_noise

LEVEL = 0.9
MIN_BOOT_SEEDS = 5  # n seeds have C(2n-1, n) distinct resamples: 10 at 3, 35 at 4, 126 at 5
E_RANGE = (0.0, 0.8)  # the sensitivity check's default E range, as shares of the baseline's lowest loss


def t_quantile(level: float, df: float) -> float:
    return float(stats.t.ppf((1 + level) / 2, df))


def _linearized(curve, variant: Cell) -> tuple[float, list[Cell], list[float]]:
    """log M and its linearization: the cells it reads (the baseline's inputs, then the variant's) and d log M /
    d (each cell's mean)."""
    loss = variant.mean
    by_points, by_loss = curve.gradients(loss)
    return curve.log_compute_for(loss) - math.log(variant.flops), [*curve.inputs, variant], [*by_points, by_loss]


def linear_variance(cells: list[Cell], weights: list[float]) -> dict:
    """The variance of sum_j w_j ybar_j over seeds (see module docstring), its df, whether seeds were paired, and
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
            out.update(var=noise["seed_var"] / len(z) + noise["item_var"] + item, df=noise["df"])
            out["item_var"] = noise["item_var"]
    else:
        seed_var = sum(w * w * c.var / c.n for w, c in zip(weights, cells))
        out.update(var=seed_var + item, df=min(c.n for c in cells) - 1)
    return out


def log_multiplier(curve, variant: Cell) -> dict:
    """log M at one variant cell against one baseline curve (a Curve or an Interpolation), with its delta-method
    variance and df (see module docstring); `var` None where a cell has < 2 seeds."""
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


def extrapolation_note(curve, variant: Cell) -> str | None:
    """Why the variant's loss gets a bound and no number, judged on the compute the baseline needs for it (the
    inverted curve), not on the points' mean losses: a fitted curve can cross the largest budget above or below
    that point's mean. None where that compute lies within the baseline's budgets."""
    budgets = [c.flops for c in curve.cells]
    span = max(budgets) / min(budgets)
    needed = curve.log_compute_for(variant.mean)
    if math.isnan(needed):
        return (
            "no number: the baseline's points do not fall steadily with compute near the variant's loss (the local "
            "quadratic turns between them)"
        )
    if needed > math.log(max(budgets)):
        bound = max(budgets) / variant.flops
        return (
            f"beyond {bound:.2g}x: the baseline would need more than its largest budget for the variant's loss (its "
            f"budgets span {span:.2g}x); a number needs a larger baseline budget"
        )
    if needed < math.log(min(budgets)):
        bound = min(budgets) / variant.flops
        return (
            f"below {bound:.2g}x: the baseline reaches the variant's loss before its smallest budget (its budgets "
            f"span {span:.2g}x); a number needs a smaller baseline budget"
        )
    return None


def _interval(est: dict, level: float) -> list[float] | None:
    if est["var"] is None:
        return None
    half = t_quantile(level, est["df"]) * math.sqrt(est["var"])
    return [math.exp(est["log_m"] - half), math.exp(est["log_m"] + half)]


def _sensitivity(base: list[Cell], variant: Cell, est: dict, floor_range, level: float) -> dict:
    """M with E pinned across a range a reader would believe (default 0 to 0.8 of the baseline's lowest loss; its
    ends and middle): M at the ends, its least and largest value, flagged where any moves log M more than the
    interval's half-width or gives no number there."""
    if floor_range is None:  # in units of the losses, not of E: an E found at 0 still gets a range
        lowest = min(c.mean for c in base)
        floor_range = (E_RANGE[0] * lowest, E_RANGE[1] * lowest)
    low, high = floor_range
    at = []
    for e in np.linspace(low, high, 3):
        curve = fit_curve(base, floor=float(e))
        m = None if isinstance(curve, str) else math.exp(curve.log_compute_for(variant.mean)) / variant.flops
        at.append(m if m is not None and 0 < m < math.inf else None)
    half = None if est["var"] is None else t_quantile(level, est["df"]) * math.sqrt(est["var"])
    moves = [abs(math.log(m) - est["log_m"]) for m in at if m is not None]
    flagged = None in at or (half is not None and any(mv > half for mv in moves))
    found = [m for m in at if m is not None]
    return {
        "E_range": [low, high],
        "multipliers": [at[0], at[-1]],
        "spread": [min(found), max(found)] if found else None,
        "flagged": bool(flagged),
    }


def shared_floor(curves_cells: dict[Hashable, list[Cell]], grid: int = 40) -> float | None:
    """One E for every rung: the value below the lowest baseline loss that minimizes the rungs' summed squared
    residuals with E pinned (each rung keeps its own A and alpha): a grid, then a bounded search between the best
    grid value's neighbours. None if no rung can be fitted."""
    lowest = min(c.mean for cells in curves_cells.values() for c in cells)

    def sse(e: float) -> float:
        total = 0.0
        for cells in curves_cells.values():
            curve = fit_curve(cells, floor=float(e))
            if isinstance(curve, str):
                return math.inf
            total += float(((curve.loss_at([c.flops for c in cells]) - [c.mean for c in cells]) ** 2).sum())
        return total

    floors = np.sort(lowest * (1 - np.geomspace(1e-3, 1, grid)))
    found = [sse(e) for e in floors]
    k = int(np.argmin(found))
    if not math.isfinite(found[k]):
        return None
    low, high = floors[max(k - 1, 0)], floors[min(k + 1, grid - 1)]
    best = optimize.minimize_scalar(sse, bounds=(low, high), method="bounded", options={"xatol": 1e-6})
    return float(best.x) if best.fun <= found[k] else float(floors[k])


def carry_shared_e(curves: dict) -> bool:
    """With one E fitted across the rungs (shared_floor), every rung's (E, log a, alpha) responds to every rung's
    points: the joint least-squares Jacobian's pseudo-inverse (E one column, each rung its own two) replaces each
    curve's own, so E's estimation error is in every interval. Not where E came out at the edge of its search (0):
    there it is a bound, not a fit, and stays held (the sensitivity check says what it moves). Returns whether it
    was carried."""
    fitted = [c for c in curves.values() if not isinstance(c, str)]
    if len(fitted) < 2 or len(fitted) != len(curves):
        return False
    if fitted[0].E <= EDGE_SHARE * min(cell.mean for c in fitted for cell in c.cells):
        return False
    basis = [cell for c in fitted for cell in c.cells]
    jac = np.zeros((len(basis), 1 + 2 * len(fitted)))
    jac[:, 0] = 1.0
    start = 0
    for k, c in enumerate(fitted):
        u = np.log(np.array([cell.flops for cell in c.cells]) / c.c0)
        core = np.exp(c.log_a - c.alpha * u)
        jac[start : start + len(u), 1 + 2 * k] = core
        jac[start : start + len(u), 2 + 2 * k] = -u * core
        start += len(u)
    response = np.linalg.pinv(jac)  # (1 + 2 rungs, points): the joint fit's linear response to the point means
    for k, c in enumerate(fitted):
        c.dtheta, c.basis = response[[0, 1 + 2 * k, 2 + 2 * k]], basis
    return True


def _row(variant: str, baseline: str, rung, cell: Cell, kind: str, level: float) -> dict:
    return {
        "variant": variant,
        "baseline": baseline,
        "rung": rung,
        "flops": cell.flops,
        "loss": cell.mean,
        "multiplier": None,
        "interval": None,
        "level": level,
        "kind": kind,
        "extrapolated": False,
        "seeds": cell.n,
        "wall_clock_multiplier": None,
        "log_multiplier": None,
        "log_se": None,
        "df": None,
        "E": None,
        "E_pinned": None,
        "sensitivity": None,
        "item_var": None,
        "read_from": None,
        "lack_of_fit": None,
        "budget_ratios": [],
        "note": "",
    }


def _fill(row: dict, curve, reader, cell: Cell, level: float, floor_range, shared: bool = False) -> None:
    """The row's multiplier, interval and notes against one rung's fit `curve` and what M is read from there,
    `reader` (the curve itself, or the local quadratic where the fit fails), or the reason there is none."""
    notes = []
    if isinstance(curve, str):
        row["note"] = curve
        return
    row.update(E=curve.E, E_pinned=curve.pinned, lack_of_fit=curve.lack_of_fit)
    row["read_from"] = "power law" if reader is curve else "local quadratic"
    if reader is not curve:
        notes.append(f"{reader.why}: M read from a quadratic in log compute through 3 of its points, without E")
    if (why := extrapolation_note(reader, cell)) is not None:
        row.update(extrapolated=not why.startswith("no number"), note="; ".join([why, *notes]))
        return
    est = log_multiplier(reader, cell)
    row.update(multiplier=math.exp(est["log_m"]), log_multiplier=est["log_m"], df=est["df"])
    row["item_var"] = est.get("item_var")  # the persistent item term of Var(log M), None without per-item files
    row["interval"] = _interval(est, level)
    if est["var"] is None:
        notes.append("fewer than 2 seeds in a cell: no interval")
    else:
        row["log_se"] = math.sqrt(est["var"])
    if curve.pinned and reader is curve:
        row["sensitivity"] = _sensitivity(curve.cells, cell, est, floor_range, level)
        if not shared:  # a shared E is said once, for every row
            notes.append(f"E pinned at {curve.E:.4g}")
        if row["sensitivity"]["flagged"]:
            low, high = row["sensitivity"]["E_range"]
            spread = row["sensitivity"]["spread"]
            moved = f"M runs {spread[0]:.3g}x to {spread[1]:.3g}x" if spread else "M is lost"
            notes.append(f"sensitive to E: over E in [{low:.4g}, {high:.4g}] {moved}, more than its interval")
    row["note"] = "; ".join(notes)


def budget_ratios(rows: list[dict], cells: dict, readers: dict, level: float) -> None:
    """Each data row with an interval gets `budget_ratios`: M at each other budget of its arm and rung over its own,
    the ratio's interval (one linear function of every cell's mean, seeds the unit: log_ratio) and whether it
    excludes 1. Nothing reads a change of M with the budget from the figures alone."""
    by_key: dict = defaultdict(list)
    for r in rows:
        if r["kind"] == "data" and r["log_se"] is not None:
            by_key[(r["variant"], r["rung"])].append(r)
    for (variant, rung), mine in by_key.items():
        by_flops = {c.flops: c for c in cells[(variant, rung)]}
        for row in mine:
            row["budget_ratios"] = []
            for other in mine:
                if other is row:
                    continue
                est = log_ratio(readers[rung], by_flops[row["flops"]], by_flops[other["flops"]])
                ci = _interval(est, level)
                row["budget_ratios"].append(
                    {
                        "flops": other["flops"],
                        "ratio": math.exp(est["log_m"]),
                        "interval": ci,
                        "established": bool(ci is not None and (ci[0] > 1 or ci[1] < 1)),
                    }
                )


def _frontier(readers: dict, cell: Cell):
    """The rung whose baseline reaches the variant's loss on the least compute (among those whose budgets hold
    it)."""
    fitted = {r: c for r, c in readers.items() if not isinstance(c, str)}
    if len(readers) < 3:
        return f"{len(readers)} rung(s): a frontier multiplier needs the baseline at >= 3"
    inside = [c for c in fitted.values() if extrapolation_note(c, cell) is None]
    if not inside:
        return "no rung's baseline budgets hold the variant's loss: the envelope would be extrapolated"
    return min(inside, key=lambda c: c.log_compute_for(cell.mean))


def multipliers(
    points: Iterable[Point],
    baseline: str,
    level: float = LEVEL,
    floor: float | str | None = None,
    floor_range: tuple[float, float] | None = None,
    throughput: dict | None = None,
    kinds: tuple[str, ...] = ("data", "frontier"),
) -> dict:
    """Every variant's multipliers against `baseline`, rung by rung, and its trend across rungs.

    floor: None (E fitted where >= 4 baseline points; no number elsewhere), a value (E pinned there at every rung)
    or "shared" (one E for all rungs, shared_floor). floor_range: the E range of the sensitivity check.
    throughput: (arm, rung) -> measured flops per second on this machine, for the wall-clock multiplier.
    kinds: the multipliers wanted ("frontier" is given only where the baseline has >= 3 rungs).
    Returns {"rows": [...], "trends": {variant: trend}, "E": the shared E or None, "E_carried": whether its
    uncertainty is in the intervals (carry_shared_e), "curves": {rung: Curve or why}}."""
    cells = group_cells(points)
    base = {rung: cs for (arm, rung), cs in cells.items() if arm == baseline}
    pinned = shared_floor(base) if floor == "shared" and base else floor
    curves = {rung: fit_curve(cs, floor=pinned) for rung, cs in base.items()}
    carried = floor == "shared" and carry_shared_e(curves)
    pool = lof_pool(curves)
    curves = {rung: check_form(c, floor == "shared" or floor is None, pool) for rung, c in curves.items()}
    readers = {rung: reader_for(c) for rung, c in curves.items()}
    rows = []
    for (arm, rung), arm_cells in sorted(cells.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        if arm == baseline:
            continue
        for cell in arm_cells:
            missing = f"no baseline points at rung {rung!r}"
            against = {"data": (curves.get(rung, missing), readers.get(rung, missing))}
            if "frontier" in kinds and len(curves) >= 3:
                reader = _frontier(readers, cell)
                fit = reader if isinstance(reader, str) else next(curves[r] for r in readers if readers[r] is reader)
                against["frontier"] = (fit, reader)
            for kind, (curve, reader) in against.items():
                if kind not in kinds:
                    continue
                row = _row(arm, baseline, rung, cell, kind, level)
                _fill(row, curve, reader, cell, level, floor_range, shared=floor == "shared")
                if kind == "frontier" and not isinstance(reader, str):  # the rung whose baseline attains the envelope
                    row["frontier_rung"] = next(r for r, c in readers.items() if c is reader)
                speeds = (throughput or {}).get((arm, rung)), (throughput or {}).get((baseline, rung))
                if row["multiplier"] is not None and None not in speeds:
                    row["wall_clock_multiplier"] = row["multiplier"] * speeds[0] / speeds[1]
                    row["wall_clock_note"] = "this machine's: M times the variant's measured FLOP/s over the baseline's"
                rows.append(row)
    budget_ratios(rows, cells, readers, level)
    variants = sorted({r["variant"] for r in rows})
    trends = {v: trend([r for r in rows if r["variant"] == v and r["kind"] == "data"], level) for v in variants}
    shared = pinned if floor == "shared" else None
    return {"rows": rows, "trends": trends, "E": shared, "E_carried": carried, "curves": curves, "readers": readers}


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
    interval): the ratio at 2 rungs, the least squares slope of log M on log flops at >= 3 (see module docstring)."""
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
