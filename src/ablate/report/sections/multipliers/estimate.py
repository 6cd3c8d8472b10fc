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

Where a rung cannot fit E (fewer than 4 baseline points), it is pinned or shared: floor.py. A variant for which
the baseline would need more compute than its largest budget (the inverted curve, not the points' mean losses: a
fitted curve can cross the largest budget above or below that point's mean) gets no number (`extrapolated: true`):
only a bound, M > C_max / C_v (or M < C_min / C_v), with the span of the budgets.
Fewer than 2 seeds in any cell: a number, no interval. One rung: no trend.

Is the curve the right one? Each rung's fit is tested, and where it fails M is read from a local quadratic instead
(baseline_curve.py: check_form, reader_for; each row says which it was read from, `read_from`, and why).

M at several budgets of one arm and rung: each row's `budget_ratios` gives M at every other budget over its own,
with the interval of that ratio (log_ratio: one linear function of every cell's mean, seeds the unit as for log M),
so that a change of M with the budget is read only where that interval excludes 1.

The intervals and the trend across rungs: intervals.py. The floor E (pinned, shared, carried, and the
sensitivity check): floor.py.

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
from collections.abc import Iterable


from ablate.report.sections.multipliers.baseline_curve import (
    Cell,
    Point,
    check_form,
    fit_curve,
    group_cells,
    lof_pool,
    reader_for,
)
from ablate.report.sections.multipliers.floor import carry_shared_e, sensitivity, shared_floor
from ablate.report.sections.multipliers.intervals import LEVEL, log_multiplier, log_ratio, multiplier_interval, trend

MIN_BOOT_SEEDS = 5  # n seeds have C(2n-1, n) distinct resamples: 10 at 3, 35 at 4, 126 at 5


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
    row["interval"] = multiplier_interval(est, level)
    if est["var"] is None:
        notes.append("fewer than 2 seeds in a cell: no interval")
    else:
        row["log_se"] = math.sqrt(est["var"])
    if curve.pinned and reader is curve:
        row["sensitivity"] = sensitivity(curve.cells, cell, est, floor_range, level)
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
                ci = multiplier_interval(est, level)
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
