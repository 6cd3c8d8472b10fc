"""The baseline's curve at one rung: its compute points (Cell), the fitted L(C) = E + A C^-alpha (Curve,
fit_curve), whether that form follows the points (check_form), and what M is read from (reader_for: the curve, or
the local quadratic, Interpolation, where it does not). estimate.py reads multipliers off these.

Is the curve the right one? E + A C^-alpha is a straight line in log (L - E) against log C, bent only by E; a curve
it cannot follow biases M with an interval that does not know it (the report's default, E shared over 3 rungs, 3
seeds, 60 ladders: a convex bend, log (L - E) + 0.1 u^2 with u = ln(C / C_r), covered an identical variant in 0.52
of rows and called it a gain in 0.38; concave, - 0.05 u^2: E driven to 0, coverage 0.71, called worse in 0.29; with
the fallback below 0.90 / 0.05 and 0.92 / 0.04, docs/reports.md has the table). Each rung's fit is tested
(lack_of_fit: its residuals on the directions its own parameters cannot move, each seed's projection one value,
Hotelling's T^2 over seeds, the variance pooled over rungs where each has one direction: lof_pool); where p <
LOF_LEVEL, or a fitted E sits at the edge of its search (edge_warning: a concave bend drives E to 0; a convex one
pulls E up towards the losses, where the test catches it), M is read from Interpolation instead: log L a quadratic
in log compute through 3 consecutive baseline points, without E, linearized in the same way (its weights on the
points' means are the quadratic's basis at the inverted compute over each mean). Over a 4x span a smooth curve is
close to its quadratic whatever it does further out (log L, not L: a power law with E = 0 is then exact, and a bend
of 0.1 u^2 costs M at 1.3 a 0.8% bias, not 1.5%); the price is a wider interval than a curve that holds. Each row
says which it was read from (`read_from`) and why.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
from scipy import stats

from ablate.report.stats.power_law import power_law_params

MIN_FREE_E_POINTS = 4  # fewer: E + A C^-alpha passes through every point for any E
EDGE_SHARE = 1e-3  # a shared E below this share of the lowest loss is at its search's edge (0): a bound, not a fit
LOF_LEVEL = 0.2  # a rung whose power law's lack-of-fit p is below this reads M from the local quadratic instead


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
    lack_of_fit: dict | None = None  # lack_of_fit(self), in the copy check_form returns
    warning: str = ""  # E at the edge of its search (edge_warning), in the copy check_form returns

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


@dataclass
class Interpolation:
    """The baseline's loss near a variant's, read with no E and no power law: log L a quadratic in u = log(C / c0)
    through 3 consecutive compute points' mean losses (of several windows, the one whose losses bracket the
    variant's, its middle point's loss nearest), inverted between the window's ends. Where the power law fails its
    lack-of-fit test or E sits at the edge of its search (lack_of_fit, edge_warning), M is read from this: over a
    4x span of compute a smooth curve is close to its quadratic, whatever its shape further out. Duck-types the
    parts of Curve that log_multiplier, extrapolation_note and the frontier read."""

    cells: list
    why: str  # the reason the power law was set aside, in words
    E = None
    pinned = False

    @property
    def inputs(self) -> list:
        return self.cells

    @property
    def c0(self) -> float:
        return float(np.exp(np.mean([math.log(c.flops) for c in self.cells])))

    def loss_range(self) -> tuple[float, float]:
        means = [c.mean for c in self.cells]
        return min(means), max(means)

    def _window(self, loss: float) -> int | None:
        means = [c.mean for c in self.cells]
        inside = [i for i in range(len(means) - 2) if min(means[i : i + 3]) <= loss <= max(means[i : i + 3])]
        return min(inside, key=lambda i: abs(means[i + 1] - loss)) if inside else None

    def _solve(self, loss: float) -> tuple[float, float, np.ndarray, int] | None:
        """(u*, dq/du at u*, d q(u*) / d (the window's means), the window's first index), or None where the window's
        quadratic does not fall steadily between its ends."""
        i = self._window(loss)
        if i is None:
            return None
        u = np.log([c.flops / self.c0 for c in self.cells[i : i + 3]])
        means = np.array([c.mean for c in self.cells[i : i + 3]])
        basis = np.linalg.inv(np.vander(u, 3, increasing=True))  # coefficients (1, u, u^2) = basis @ log means
        coef = basis @ np.log(means)
        if max(coef[1] + 2 * coef[2] * u[0], coef[1] + 2 * coef[2] * u[2]) >= 0:
            return None
        target = math.log(loss)
        if abs(coef[2]) > 1e-15:
            roots = np.roots([coef[2], coef[1], coef[0] - target])
        else:
            roots = [(target - coef[0]) / coef[1]]
        real = [float(r.real) for r in np.atleast_1d(roots) if abs(complex(r).imag) < 1e-12]
        inside = [r for r in real if u[0] - 1e-9 <= r <= u[2] + 1e-9]
        if not inside:
            return None
        root = inside[0]
        slope = coef[1] + 2 * coef[2] * root  # d log L / du there
        return root, slope, (np.array([1.0, root, root * root]) @ basis) / means, i

    def log_compute_for(self, loss: float) -> float:
        """log C_base(loss): +inf below the loss of the largest budget, -inf above the smallest's, nan where the
        points do not fall steadily there."""
        means = [c.mean for c in self.cells]
        if loss < min(means[-1], min(means)):
            return math.inf
        if loss > max(means[0], max(means)):
            return -math.inf
        found = self._solve(loss)
        return math.nan if found is None else math.log(self.c0) + found[0]

    def gradients(self, loss: float) -> tuple[np.ndarray, float]:
        """d log C_base(loss) / d (every baseline point's mean; 0 outside the window), and / d loss."""
        root, slope, by_means, i = self._solve(loss)
        out = np.zeros(len(self.cells))
        out[i : i + 3] = -by_means / slope
        return out, 1 / (slope * loss)


def _residual_directions(curve: Curve) -> tuple[int, np.ndarray | None]:
    """(rank, null): the directions of the points' residuals the rung's own parameters cannot move, the null space
    of its Jacobian's transpose (k points less its 2 parameters, 3 with E free), as orthonormal columns."""
    u = np.log(np.array([c.flops for c in curve.cells]) / curve.c0)
    core = np.exp(curve.log_a - curve.alpha * u)
    jac = np.column_stack(([np.ones_like(u)] if not curve.pinned else []) + [core, -u * core])
    rank = len(curve.cells) - jac.shape[1]
    return rank, (np.linalg.svd(jac.T)[2][jac.shape[1] :].T if rank > 0 else None)


def _lof_contrasts(curve: Curve) -> tuple[int, np.ndarray | None, int]:
    """The rung's residuals projected on the directions its own parameters cannot move (the null space of its
    Jacobian's transpose: k points less its 2 parameters, 3 with E free), one row per seed where every point holds
    the same seeds, else one row of the mean residuals; with the rank and the least seeds at a point."""
    cells = curve.cells
    rank, null = _residual_directions(curve)
    n = min(c.n for c in cells)
    if rank <= 0:
        return rank, None, n
    fitted = curve.loss_at([c.flops for c in cells])
    if len({frozenset(c.losses) for c in cells}) == 1:
        seeds = list(cells[0].losses)
        return rank, (np.array([[c.losses[s] for c in cells] for s in seeds]) - fitted) @ null, n
    return rank, None, n


def lack_of_fit(curve: Curve, pool: tuple[float, int] | None = None) -> dict:
    """Does E + A C^-alpha follow this rung's points? Its residual contrasts (_lof_contrasts), each seed's one
    value: Hotelling's T^2 over seeds (an F on (r, n - r) df); with one direction and `pool` (the contrasts' seed
    variance pooled over the baseline's rungs, and its df), t^2 = n zbar^2 / pooled variance on (1, pooled df).
    Pooling matters beyond power: a rung's own 2-df variance, when small, both rejects the fit and makes the
    quadratic's interval narrow (the rows sent to it by a per-rung test covered in 0.70 on straight ladders).
    Points with different seeds: a Wald statistic, the points taken as independent (F on (r, min n_j - 1)). p None
    where the points leave no direction (as many parameters as points) or too few seeds. A shared E is held at its
    value here: the rung is tested with the E every rung gave it."""
    rank, z, n = _lof_contrasts(curve)
    out = {"p": None, "stat": None, "df": None, "directions": rank, "pooled": False}
    if rank <= 0:
        out["note"] = f"{len(curve.cells)} points for {len(curve.cells) - rank} parameters: the form is not tested"
        return out
    if z is not None and (n > rank or (pool is not None and rank == 1 and n >= 2)):
        zbar = z.mean(axis=0)
        if rank == 1 and pool is not None:
            var, df2 = pool
            cov = np.array([[var]])
            out["pooled"] = True
        else:
            cov, df2 = np.atleast_2d(np.cov(z, rowvar=False)), n - rank
        if np.trace(cov) <= 1e-24:  # no spread over seeds: any residual is lack of fit
            out.update(p=float(np.abs(zbar).max() <= 1e-9), stat=math.inf, df=[rank, df2])
            return out
        t2 = float(n * zbar @ np.linalg.pinv(cov) @ zbar)
        stat = t2 if out["pooled"] else (n - rank) / (rank * (n - 1)) * t2
        df = (rank, df2)
    elif n >= 2:
        cells = curve.cells
        fitted = curve.loss_at([c.flops for c in cells])
        null = _residual_directions(curve)[1]
        zbar = (np.array([c.mean for c in cells]) - fitted) @ null
        cov = null.T @ np.diag([c.var / c.n for c in cells]) @ null
        stat, df = float(zbar @ np.linalg.pinv(cov) @ zbar) / rank, (rank, n - 1)
    else:
        out["note"] = "fewer than 2 seeds at a point: the form is not tested"
        return out
    out.update(p=float(stats.f.sf(stat, *df)), stat=stat, df=list(df))
    return out


def lof_pool(curves: dict) -> tuple[float, int] | None:
    """The seed variance of the rungs' one-direction residual contrasts, pooled (df-weighted) over every fitted
    rung, and its df; None where fewer than 2 rungs have such a contrast over >= 2 shared seeds."""
    found = []
    for curve in curves.values():
        if isinstance(curve, str):
            continue
        rank, z, n = _lof_contrasts(curve)
        if rank == 1 and z is not None and n >= 2:
            found.append((float(np.var(z[:, 0], ddof=1)), n - 1))
    if len(found) < 2:
        return None
    df = sum(d for _, d in found)
    return sum(v * d for v, d in found) / df, df


def edge_warning(curve: Curve, shared: bool) -> str:
    """A fitted E (free, or shared across rungs) at either end of its search, 0 or the lowest loss: the points
    ask for a curve E + A C^-alpha cannot bend into (a concave bend in log (L - E) against log C drives E to 0),
    or they do not pin E at all. "" where E is inside or was given."""
    if curve.pinned and not shared:
        return ""
    lowest = min(c.mean for c in curve.cells)
    if curve.E <= EDGE_SHARE * lowest:
        return "E at 0, the edge of its search"
    if curve.E >= (1 - 2 * EDGE_SHARE) * lowest:
        return "E at the rung's lowest loss, the edge of its search"
    return ""


def check_form(curve: Curve | str, shared: bool, pool: tuple[float, int] | None = None) -> Curve | str:
    """The fitted curve with its form checked: a copy carrying its lack_of_fit (pool: lof_pool over the baseline's
    rungs) and its edge_warning. A reason (no curve) passes through."""
    if isinstance(curve, str):
        return curve
    return replace(curve, lack_of_fit=lack_of_fit(curve, pool), warning=edge_warning(curve, shared))


def reader_for(curve: Curve | str, level: float = LOF_LEVEL) -> Curve | Interpolation | str:
    """What M is read from at one rung (a curve through check_form): its power law where that follows the points
    (lack of fit p >= level, E inside its search), else the local quadratic (Interpolation) with the reason."""
    if isinstance(curve, str):
        return curve
    p = (curve.lack_of_fit or {}).get("p")
    why = []
    if p is not None and p < level:
        why.append(f"E + A C^-alpha does not follow the baseline's points here (lack of fit p = {p:.2g})")
    if curve.warning:
        why.append(f"{curve.warning} (a curvature warning)")
    if not why:
        return curve
    return Interpolation(curve.cells, "; ".join(why))
