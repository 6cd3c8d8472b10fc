"""How often `ablate report` claims a difference where there is none, and finds one that is there, at the designs
researchers run: A/A and planted-effect studies at 3, 5 and 8 seeds, 60 and 1000 items a task, with per-run item
quirks that persist across checkpoints and per-variant item quirks that persist across seeds (a population null), a
scale axis (decision accuracy ranks each task's metrics) and a subject floor. Every study goes through the report's
own path (ablate.report.calibrate). docs/reports.md quotes its output.

    python scripts/calibrate_report.py --jobs 2     # 2000 studies per design (about an hour on two cores)
    python scripts/calibrate_report.py --smoke      # 2 studies per design: the script still works
"""

from __future__ import annotations

import argparse
import time

from ablate.report.calibrate import SD_DIFF, Design, calibrate


def designs(effect: float, items=(60, 1000)) -> list[Design]:
    return [Design(seeds=s, items=n, effect=e) for e in (0.0, effect) for s in (3, 5, 8) for n in items]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--studies", type=int, default=2000, help="studies per design (default 2000)")
    parser.add_argument("--effect", type=float, default=4.0, help="planted effect, in seed-level sds (default 4)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="2 studies per design")
    parser.add_argument("--items", type=int, nargs="+", default=[60, 1000], help="items per task (default 60 1000)")
    args = parser.parse_args()
    studies = 2 if args.smoke else args.studies
    print(
        f"{studies} studies per design; effect unit: one seed-level sd of the paired validation-loss difference "
        f"({SD_DIFF:.4f}); planted on variant A at every scale"
    )
    print(
        "| design | any claim (A/A: <= 0.05) | winner named | right winner | wrong winner | A ahead on val loss | s |"
    )
    print("|---|---|---|---|---|---|---|")
    worst_aa = 0.0
    for k, design in enumerate(designs(args.effect, args.items)):
        start = time.perf_counter()
        r = calibrate(design, studies, seed=args.seed * 100 + k, jobs=args.jobs)

        def f(key: str, r=r) -> str:
            p, se = r[key]
            return f"{p:.3f} +- {se:.3f}"

        if design.effect == 0:
            worst_aa = max(worst_aa, r["any_claim"][0])
        print(
            f"| {design.label()} | {f('any_claim')} | {f('winner_named')} | {f('right_winner')} | "
            f"{f('wrong_winner')} | {f('primary_found')} | {time.perf_counter() - start:.0f} |",
            flush=True,
        )
    print(f"ratio worst A/A any-claim rate / alpha: {worst_aa / 0.05:.2f}x")


if __name__ == "__main__":
    main()
