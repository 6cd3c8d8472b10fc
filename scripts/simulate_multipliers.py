"""Compute multipliers (ablate.report.sections.multipliers.estimate) on constructed ladders with a planted multiplier.

Rung r (r = 0, 1, 2) has budget C_r = 1e17 * 4^r flops and a baseline curve L_r(C) = 2.0 + a_r (C / C_r)^-0.3 with
a_r = 1.2 * 4^(-0.15 r) (larger models reach lower loss). The baseline is trained to several compute points per
rung; the variant once, at C_r, and its loss is the baseline's curve at m_r C_r: its true multiplier is m_r.
Seed noise: a seed effect N(0, 0.008) shared by one seed's runs at a rung (the baseline's compute points are one
run's annealed endpoints; the variant with that seed shares its data order), plus N(0, 0.006) per point: a point's
seed sd is 0.01 in loss, as in small real runs.

Designs: "pinned E 3 points" (the baseline at 0.5, 1.41 and 4 x C_r, E pinned at its true 2.0) and "free E 4
points" (0.5, 1, 2 and 4 x C_r, E fitted), and the report's default for compute_points()' 0.5, 1 and 2 x C_r: one E
shared across the rungs ("shared E 3 points", at 3 rungs and at 2); 3 and 5 seeds; planted m = 1.0, 1.3, 2.0 at every
rung. Printed per cell:
the nominal 90% interval's coverage of m over every (ladder, rung) row (with its Monte Carlo standard error), the
share of rows with no number (extrapolated), and for m = 1.0 the rate at which it is called a gain (interval above
1). Then the trend: A/A (m = 1 at every rung) the false-positive rate of an established slope, and a planted
shrink (2.0, 1.5, 1.2; and a milder 1.3, 1.15, 1.0) the share whose slope
interval lies below 0. And at 5 seeds, the seed bootstrap's coverage.

Curvature (--tables curvature): the same ladders with each rung's baseline bent, log (L_r - E) = log a_r - 0.3 u +
kappa u^2, u = ln(C / C_r), kappa in CURVES (0; +0.1 convex: flattening faster than a power law; -0.05 concave),
the variant at the bent curve's m C_r (m = 1.0, 1.3): coverage, the rates at which m = 1 is called a gain or worse,
the share of rows read from the local quadratic (baseline_curve.Interpolation) and of rows refused with a reason.
Beyond (--tables beyond): m = 1.99 at 1x with the baseline's points ending at 2x: the share of rows that read
"beyond 2x", and of those with a number, their mean, the share above 2 and how often the interval misses 1.99.

    python scripts/simulate_multipliers.py            # 200 ladders per cell
    python scripts/simulate_multipliers.py --smoke    # 20 per cell
    python scripts/simulate_multipliers.py --designs "shared E 3 points"   # one design
    python scripts/simulate_multipliers.py --tables curvature,beyond --ladders 60 --seeds 3,5
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from ablate.report.sections.multipliers.baseline_curve import Point
from ablate.report.sections.multipliers.checks import bootstrap_interval
from ablate.report.sections.multipliers.estimate import multipliers

E, ALPHA, SEED_SD, POINT_SD = 2.0, 0.3, 0.008, 0.006
BUDGETS = [1e17 * 4**r for r in range(3)]
CURVES = (0.0, 0.1, -0.05)  # kappa: the power law, convex and concave in log (L - E) vs log C
TABLES = ("planted", "trend", "bootstrap", "curvature", "beyond")
SHRINKS = (("A/A 1,1,1", [1.0] * 3), ("shrink 2,1.5,1.2", [2.0, 1.5, 1.2]), ("shrink 1.3,1.15,1", [1.3, 1.15, 1.0]))
# name: (the baseline's budgets as multiples of the rung's, E: pinned value / None: fitted / "shared", rungs)
DESIGNS = {
    "pinned E 3 points": ([0.5, 2**0.5, 4.0], E, 3),
    "free E 4 points": ([0.5, 1.0, 2.0, 4.0], None, 3),
    # what compute_points() and `ablate report --baseline` give by default: 0.5, 1 and 2x, one E for every rung
    "shared E 3 points": ([0.5, 1.0, 2.0], "shared", 3),
    "shared E 3 points 2 rungs": ([0.5, 1.0, 2.0], "shared", 2),
}


def true_loss(rung: int, flops: float, kappa: float = 0.0) -> float:
    """The rung's baseline: log (L - E) = log a_r - alpha u + kappa u^2, u = ln(C / C_r) (kappa 0: the power law)."""
    u = math.log(flops / BUDGETS[rung])
    return E + 1.2 * 4 ** (-0.15 * rung) * math.exp(-ALPHA * u + kappa * u * u)


def ladder(
    rng: np.random.Generator, planted: list[float], fractions: list[float], seeds: int, kappa: float = 0.0
) -> list[Point]:
    points = []
    for rung, m in enumerate(planted):
        budget = BUDGETS[rung]
        for s in range(seeds):
            shift = rng.normal(0, SEED_SD)  # one seed's runs at this rung move together
            for f in fractions:
                loss = true_loss(rung, f * budget, kappa) + shift + rng.normal(0, POINT_SD)
                points.append(Point("baseline", rung, s, f * budget, loss))
            loss = true_loss(rung, m * budget, kappa) + shift + rng.normal(0, POINT_SD)
            points.append(Point("variant", rung, s, budget, loss))
    return points


def _rate(hits: int, n: int) -> str:
    if n == 0:
        return "   -          "
    p = hits / n
    return f"{p:5.3f} +- {math.sqrt(max(p * (1 - p), 1e-12) / n):5.3f}"


def cell(rng, design: str, seeds: int, planted: list[float], ladders: int, kappa: float = 0.0) -> dict:
    fractions, floor, rungs = DESIGNS[design]
    planted = planted[:rungs]
    covered = rows = gains = worse = missing = refused = local = established_down = established = 0
    for _ in range(ladders):
        out = multipliers(ladder(rng, planted, fractions, seeds, kappa), "baseline", floor=floor, kinds=("data",))
        for row in out["rows"]:
            if row["kind"] != "data":
                continue
            if row["multiplier"] is None:
                missing += 1
                refused += not row["extrapolated"]
                continue
            low, high = row["interval"]
            rows += 1
            covered += low <= planted[row["rung"]] <= high
            gains += low > 1
            worse += high < 1
            local += row.get("read_from") == "local quadratic"
        t = out["trends"]["variant"]
        established += t["established"]
        shrinks = t["interval"] is not None and t["interval"][1] < (0 if t["slope"] is not None else 1)
        established_down += t["established"] and shrinks
    return {
        "coverage": _rate(covered, rows),
        "gain": _rate(gains, rows),
        "worse": _rate(worse, rows),
        "missing": missing / (missing + rows),
        "refused": refused / (missing + rows),
        "local": local / max(rows, 1),
        "established": _rate(established, ladders),
        "down": _rate(established_down, ladders),
    }


def bootstrap_coverage(rng, ladders: int, planted: float = 1.3, n_boot: int = 100) -> str:
    fractions, floor, _ = DESIGNS["free E 4 points"]
    hits = n = 0
    for _ in range(ladders):
        points = ladder(rng, [planted], fractions, 5)
        found = bootstrap_interval(points, "variant", "baseline", 0, floor=floor, n_boot=n_boot)
        if found["interval"] is not None:
            n += 1
            hits += found["interval"][0] <= planted <= found["interval"][1]
    return _rate(hits, n)


def beyond(rng, ladders: int, design: str = "shared E 3 points", planted: float = 1.99) -> dict:
    """A variant worth 1.99x at 1x, the baseline's points ending at 2x: how many rows say "beyond 2x", and of those
    with a number, the mean M and how often the interval misses the truth."""
    fractions, floor, rungs = DESIGNS[design]
    said = numbers = missed = 0
    found = []
    for _ in range(ladders):
        out = multipliers(ladder(rng, [planted] * rungs, fractions, 3), "baseline", floor=floor, kinds=("data",))
        for row in out["rows"]:
            if row["multiplier"] is None:
                said += row["note"].startswith("beyond")
                continue
            numbers += 1
            found.append(row["multiplier"])
            missed += not row["interval"][0] <= planted <= row["interval"][1]
    return {
        "beyond": said / (said + numbers),
        "numbers": numbers,
        "mean": float(np.mean(found)) if found else math.nan,
        "above 2": float(np.mean(np.array(found) > 2.0)) if found else math.nan,
        "missed": _rate(missed, numbers),
    }


def curvature_table(rng, designs: list[str], ladders: int, seeds_list=(3, 5)) -> None:
    print("\ncurved baselines: log (L - E) = log a_r - 0.3 u + kappa u^2, u = ln(C / C_r); the variant at m C_r")
    head = f"{'design':26s} {'seeds':>5s} {'kappa':>6s} {'m':>4s}  {'coverage':14s}  {'called a gain':14s}"
    print(f"{head}  {'called worse':14s}  local  refused")
    for design in designs:
        for seeds in seeds_list:
            for kappa in CURVES:
                for m in (1.0, 1.3):
                    r = cell(rng, design, seeds, [m] * 3, ladders, kappa)
                    gain, worse = (r["gain"], r["worse"]) if m == 1.0 else ("", "")
                    print(
                        f"{design:26s} {seeds:5d} {kappa:6.2f} {m:4.1f}  {r['coverage']}  {gain:14s}  {worse:14s}  "
                        f"{r['local']:.3f}  {r['refused']:.3f}",
                        flush=True,
                    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="20 ladders per cell")
    parser.add_argument("--ladders", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--designs", default=",".join(DESIGNS), help=f"comma-separated, of: {', '.join(DESIGNS)} (default: all)"
    )
    parser.add_argument(
        "--tables", default=",".join(TABLES), help=f"comma-separated, of: {', '.join(TABLES)} (default: all)"
    )
    parser.add_argument("--seeds", default="3,5", help="the seed counts of the curvature table (default: 3,5)")
    args = parser.parse_args()
    designs = [d.strip() for d in args.designs.split(",") if d.strip()]
    if unknown := [d for d in designs if d not in DESIGNS]:
        parser.error(f"--designs {', '.join(unknown)}: allowed: {', '.join(DESIGNS)}")
    tables = [t.strip() for t in args.tables.split(",") if t.strip()]
    if unknown := [t for t in tables if t not in TABLES]:
        parser.error(f"--tables {', '.join(unknown)}: allowed: {', '.join(TABLES)}")
    ladders = 20 if args.smoke else args.ladders
    rng = np.random.default_rng(args.seed)
    start = time.time()
    print(f"{ladders} ladders per cell, nominal 90% intervals (coverage over every rung's row)")
    if "planted" in tables:
        print(f"{'design':24s} {'seeds':>5s} {'m':>4s}  {'coverage':14s}  {'called a gain':14s}  no number")
        for design in designs:
            for seeds in (3, 5):
                for m in (1.0, 1.3, 2.0):
                    r = cell(rng, design, seeds, [m] * 3, ladders)
                    gain = r["gain"] if m == 1.0 else ""
                    print(f"{design:24s} {seeds:5d} {m:4.1f}  {r['coverage']}  {gain:14s}  {r['missing']:.3f}")
    if "trend" in tables:
        print("\ntrend across the rungs (3: slope of log M on log compute; 2: the ratio of the two M)")
        print(f"{'design':24s} {'seeds':>5s} {'planted':16s}  {'established':14s}  {'shrinking':14s}")
        for design in designs:
            for seeds in (3, 5):
                for name, planted in SHRINKS:
                    r = cell(rng, design, seeds, planted, ladders)
                    print(f"{design:24s} {seeds:5d} {name:16s}  {r['established']}  {r['down']}")
    if "bootstrap" in tables:
        boot = max(10, ladders // 8)
        covered = bootstrap_coverage(rng, boot)
        print(f"\nseed bootstrap, free E, 5 seeds, m = 1.3, one rung: coverage {covered} ({boot} ladders)")
    if "curvature" in tables:
        curvature_table(rng, designs, ladders, tuple(int(k) for k in args.seeds.split(",")))
    if "beyond" in tables:
        print("\nm = 1.99 at 1x, the baseline's points at 0.5, 1, 2x (3 seeds): a number only inside its budgets")
        for design in [d for d in designs if d.startswith("shared")]:
            r = beyond(rng, ladders, design)
            print(
                f"{design:26s} beyond 2x {r['beyond']:.3f}; {r['numbers']} numbers: mean M {r['mean']:.3f}, "
                f"share above 2 {r['above 2']:.3f}, interval misses 1.99 {r['missed']}"
            )
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
