"""Effects in the currency of compute: a variant's compute multiplier on a ladder of model sizes (rungs).

At one rung the baseline is trained to several compute budgets (its compute points, each an annealed endpoint,
each with several seeds). Its curve L(C) = E + A C^-alpha is fitted through the points' mean losses (least squares
on L, grid/fits.power_law_params) and inverted: C_base(L) = (A / (L - E))^(1/alpha). A variant that used C_v flops
and reached mean loss L_v is worth M = C_base(L_v) / C_v: the baseline would need M times the compute for that loss.

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
multiplier is then recomputed at the ends of a stated E range (default E +- 5% of the lowest baseline loss, within
[0, that loss)) and flagged when it moves more than its interval's half-width. A variant whose mean loss lies
outside the range of the baseline's point losses gets no number (`extrapolated: true`): only a bound, M > C_max / C_v
(or M < C_min / C_v), with the span of the budgets. Fewer than 2 seeds in any cell: a number, no interval. One rung:
no trend.

Interval (level 0.9). A delta-method t interval on log M. log M is a smooth function of the cells' mean losses
(the baseline points' through the fitted parameters, d theta / d ybar = (J'J)^-1 J' at the fit, and the variant's
directly), so it is linearized to sum_j h_j ybar_j. When every cell holds the same seeds, each seed's linearized
value z_s = sum_j h_j y_js is formed and Var(log M) = var(z) / n with n - 1 degrees of freedom: seeds are the unit
of replication, and a seed's compute points (one run, several endpoints) and the variant run sharing its seed are
taken together, whatever their correlation. Otherwise the cells are taken as independent, Var = sum_j h_j^2 s_j^2
/ n_j, on min(n_j) - 1 degrees of freedom (conservative: Satterthwaite's would be larger). The validation set is the
same for every seed, so a persistent item term does not shrink with seeds. Where every point has its per-item
validation losses (`items`), the (seeds, items) matrix of linearized per-item values sum_j h_j y_jsi is split as
every paired difference of the report is (inference/stats.paired_noise: seed variance floored by the fresh noise,
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
from its true value, M is biased: that is what the sensitivity check reports.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from scipy import optimize, stats

from ablate.report.grid.fits import power_law_params
from ablate.report.inference.stats import paired_noise

LEVEL = 0.9
MIN_FREE_E_POINTS = 4  # fewer: E + A C^-alpha passes through every point for any E
MIN_BOOT_SEEDS = 5  # n seeds have C(2n-1, n) distinct resamples: 10 at 3, 35 at 4, 126 at 5
FLOOR_SPREAD = 0.05  # the default E range for the sensitivity check: E +- 5% of the baseline's lowest loss
EDGE_SHARE = 1e-3  # a shared E below this share of the lowest loss is at its search's edge (0): a bound, not a fit


@dataclass(frozen=True)
class Point:
    """One run's loss at one compute budget: arm (variant name), rung (a model size label), seed, flops, loss.
    item_var: the variance of this loss from the finite validation set (shared by every seed; 0 if unknown)."""

    arm: str
    rung: Hashable
    seed: Hashable
    flops: float
    loss: float
    item_var: float = 0.0
    items: np.ndarray | None = field(default=None, compare=False)  # per-item validation losses, one id order


@dataclass
class Cell:
    """One compute point of one arm at one rung: its seeds' losses (seed -> loss)."""

    flops: float
    losses: dict
    item_var: float = 0.0
    items: dict | None = None  # seed -> per-item losses (every point of the cell has them, all of one length)

    @property
    def n(self) -> int:
        return len(self.losses)

    @cached_property  # read many times per fit; a cell's losses are not changed after it is built
    def mean(self) -> float:
        return float(np.mean(list(self.losses.values())))

    @property
    def var(self) -> float:
        return float(np.var(list(self.losses.values()), ddof=1)) if self.n >= 2 else math.nan


def group_cells(points: Iterable[Point]) -> dict[tuple[str, Hashable], list[Cell]]:
    """(arm, rung) -> its compute points, by increasing flops. Runs whose flops agree to 3 significant figures are
    one compute point (measured flops differ a little between seeds); its flops are their mean."""
    groups: dict = defaultdict(lambda: defaultdict(list))
    for p in points:
        groups[(p.arm, p.rung)][float(f"{p.flops:.3g}")].append(p)
    return {
        key: [
            Cell(
                flops=float(np.mean([p.flops for p in ps])),
                losses={p.seed: p.loss for p in ps},
                item_var=float(np.mean([p.item_var for p in ps])),
                items={p.seed: p.items for p in ps} if all(p.items is not None for p in ps) else None,
            )
            for _, ps in sorted(by_flops.items())
        ]
        for key, by_flops in groups.items()
    }


@dataclass
class Curve:
    """The baseline's fitted L(C) = E + a (C / c0)^-alpha at one rung (c0: the points' geometric mean compute, so
    log A and alpha are not collinear), with d theta / d ybar: how (E, log a, alpha) move with each point's mean."""

    E: float
    log_a: float
    alpha: float
    c0: float
    pinned: bool
    dtheta: np.ndarray  # (3, inputs); E's row is 0 when pinned
    cells: list
    basis: list | None = None  # the points dtheta responds to, where not only this rung's (a shared E: every rung's)

    @property
    def inputs(self) -> list:
        return self.basis if self.basis is not None else self.cells

    @property
    def A(self) -> float:
        return math.exp(self.log_a + self.alpha * math.log(self.c0))

    def loss_at(self, flops):
        return self.E + np.exp(self.log_a - self.alpha * np.log(np.asarray(flops, float) / self.c0))

    def log_compute_for(self, loss: float) -> float:
        """log C_base(loss); +inf at or below E."""
        if loss <= self.E:
            return math.inf
        return math.log(self.c0) + (self.log_a - math.log(loss - self.E)) / self.alpha

    def gradients(self, loss: float) -> tuple[np.ndarray, float]:
        """d log C_base(loss) / d (the means of the baseline points in `inputs`), and / d loss."""
        gap = loss - self.E
        by_theta = np.array([1 / (self.alpha * gap), 1 / self.alpha, -(self.log_a - math.log(gap)) / self.alpha**2])
        return by_theta @ self.dtheta, -1 / (self.alpha * gap)

    def loss_range(self) -> tuple[float, float]:
        means = [c.mean for c in self.cells]
        return min(means), max(means)


def fit_curve(cells: list[Cell], floor: float | None = None) -> Curve | str:
    """The baseline's curve through its compute points' mean losses, or the reason there is none. E is fitted with
    >= 4 points unless `floor` pins it; with 3 it must be pinned."""
    flops = np.array([c.flops for c in cells])
    means = np.array([c.mean for c in cells])
    if len(cells) < 3:
        return f"the baseline has {len(cells)} compute point(s) here: its curve needs >= 3"
    if floor is None and len(cells) < MIN_FREE_E_POINTS:
        return f"{len(cells)} baseline compute points cannot identify E (3 parameters pass through 3 points): pin E"
    c0 = float(np.exp(np.log(flops).mean()))
    params = power_law_params(flops / c0, means, floor=floor)
    if params is None:
        if floor is not None and floor >= means.min():
            return f"the pinned E = {floor:.4g} is not below the baseline's losses"
        return "the baseline's loss does not fall with compute"
    e, log_a, alpha = (float(v) for v in params)
    u = np.log(flops / c0)
    core = np.exp(log_a - alpha * u)
    jac = np.column_stack([np.ones_like(u), core, -u * core])
    free = [1, 2] if floor is not None else [0, 1, 2]
    dtheta = np.zeros((3, len(cells)))
    dtheta[free] = np.linalg.pinv(jac[:, free])  # (J'J)^-1 J': the fit's linear response to the point means
    return Curve(e, log_a, alpha, c0, floor is not None, dtheta, list(cells))


def t_quantile(level: float, df: float) -> float:
    return float(stats.t.ppf((1 + level) / 2, df))


def log_multiplier(curve: Curve, variant: Cell) -> dict:
    """log M at one variant cell against one baseline curve, with its delta-method variance and df (see module
    docstring); `var` None where a cell has < 2 seeds."""
    loss = variant.mean
    by_points, by_loss = curve.gradients(loss)
    cells, weights = [*curve.inputs, variant], [*by_points, by_loss]
    out = {"log_m": curve.log_compute_for(loss) - math.log(variant.flops), "var": None, "df": None, "paired": False}
    if min(c.n for c in cells) < 2:
        return out
    item = sum(w * w * c.item_var for w, c in zip(weights, cells))
    if len({frozenset(c.losses) for c in cells}) == 1:  # every cell holds the same seeds: the seed is the unit
        seeds = list(variant.losses)
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


def extrapolation_note(curve: Curve, variant: Cell) -> str | None:
    low, high = curve.loss_range()
    budgets = [c.flops for c in curve.cells]
    span = max(budgets) / min(budgets)
    if variant.mean < low:
        bound = max(budgets) / variant.flops
        return (
            f"beyond {bound:.2g}x: the variant's loss is below the baseline's at its largest budget (the baseline's "
            f"budgets span {span:.2g}x); a number needs a larger baseline budget"
        )
    if variant.mean > high:
        bound = min(budgets) / variant.flops
        return (
            f"below {bound:.2g}x: the variant's loss is above the baseline's at its smallest budget (the baseline's "
            f"budgets span {span:.2g}x); a number needs a smaller baseline budget"
        )
    return None


def _interval(est: dict, level: float) -> list[float] | None:
    if est["var"] is None:
        return None
    half = t_quantile(level, est["df"]) * math.sqrt(est["var"])
    return [math.exp(est["log_m"] - half), math.exp(est["log_m"] + half)]


def _sensitivity(base: list[Cell], variant: Cell, est: dict, floor: float, floor_range, level: float) -> dict:
    """M at the ends of the E range; flagged when either moves log M more than the interval's half-width."""
    if floor_range is None:  # in units of the losses, not of E: an E found at 0 still gets a range
        lowest = min(c.mean for c in base)
        floor_range = (max(floor - FLOOR_SPREAD * lowest, 0.0), min(floor + FLOOR_SPREAD * lowest, 0.999 * lowest))
    low, high = floor_range
    at = {}
    for e in (low, high):
        curve = fit_curve(base, floor=e)
        at[e] = None if isinstance(curve, str) else math.exp(curve.log_compute_for(variant.mean)) / variant.flops
    half = None if est["var"] is None else t_quantile(level, est["df"]) * math.sqrt(est["var"])
    moves = [abs(math.log(m) - est["log_m"]) for m in at.values() if m is not None and 0 < m < math.inf]
    flagged = any(m is None for m in at.values()) or (half is not None and any(mv > half for mv in moves))
    return {"E_range": [low, high], "multipliers": [at[low], at[high]], "flagged": bool(flagged)}


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
        "note": "",
    }


def _fill(row: dict, curve: Curve | str, cell: Cell, level: float, floor, floor_range, shared: bool = False) -> None:
    """The row's multiplier, interval and notes against one curve (or the reason there is none)."""
    notes = []
    if isinstance(curve, str):
        row["note"] = curve
        return
    row.update(E=curve.E, E_pinned=curve.pinned)
    if (why := extrapolation_note(curve, cell)) is not None:
        row.update(extrapolated=True, note=why)
        return
    est = log_multiplier(curve, cell)
    row.update(multiplier=math.exp(est["log_m"]), log_multiplier=est["log_m"], df=est["df"])
    row["item_var"] = est.get("item_var")  # the persistent item term of Var(log M), None without per-item files
    row["interval"] = _interval(est, level)
    if est["var"] is None:
        notes.append("fewer than 2 seeds in a cell: no interval")
    else:
        row["log_se"] = math.sqrt(est["var"])
    if curve.pinned:
        row["sensitivity"] = _sensitivity(curve.cells, cell, est, curve.E, floor_range, level)
        if not shared:  # a shared E is said once, for every row
            notes.append(f"E pinned at {curve.E:.4g}")
        if row["sensitivity"]["flagged"]:
            low, high = row["sensitivity"]["E_range"]
            notes.append(f"sensitive to E: over E in [{low:.4g}, {high:.4g}] M moves more than its interval")
    row["note"] = "; ".join(notes)


def _frontier(curves: dict, cell: Cell) -> Curve | str:
    """The rung whose baseline reaches the variant's loss on the least compute (among those bracketing it)."""
    fitted = {r: c for r, c in curves.items() if not isinstance(c, str)}
    if len(curves) < 3:
        return f"{len(curves)} rung(s): a frontier multiplier needs the baseline at >= 3"
    inside = [c for c in fitted.values() if c.loss_range()[0] <= cell.mean <= c.loss_range()[1]]
    if not inside:
        return "no rung's baseline points bracket the variant's loss: the envelope would be extrapolated"
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
    rows = []
    for (arm, rung), arm_cells in sorted(cells.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        if arm == baseline:
            continue
        for cell in arm_cells:
            against = {"data": curves.get(rung, f"no baseline points at rung {rung!r}")}
            if "frontier" in kinds and len(curves) >= 3:
                against["frontier"] = _frontier(curves, cell)
            for kind, curve in against.items():
                if kind not in kinds:
                    continue
                row = _row(arm, baseline, rung, cell, kind, level)
                _fill(row, curve, cell, level, pinned, floor_range, shared=floor == "shared")
                if kind == "frontier" and not isinstance(curve, str):  # the rung whose baseline attains the envelope
                    row["frontier_rung"] = next(r for r, c in curves.items() if c is curve)
                speeds = (throughput or {}).get((arm, rung)), (throughput or {}).get((baseline, rung))
                if row["multiplier"] is not None and None not in speeds:
                    row["wall_clock_multiplier"] = row["multiplier"] * speeds[0] / speeds[1]
                    row["wall_clock_note"] = "this machine's: M times the variant's measured FLOP/s over the baseline's"
                rows.append(row)
    variants = sorted({r["variant"] for r in rows})
    trends = {v: trend([r for r in rows if r["variant"] == v and r["kind"] == "data"], level) for v in variants}
    shared = pinned if floor == "shared" else None
    return {"rows": rows, "trends": trends, "E": shared, "E_carried": carried, "curves": curves}


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
