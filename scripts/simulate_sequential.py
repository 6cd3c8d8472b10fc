"""Adaptive studies simulated through the decision code `ablate run --until-decided` and `ablate report` use
(ablate.report.sections.sequential: the confidence sequence, its running intersection, decide, open_variants), with the
study's round logic: round 1 trains 3 seeds of every variant, each later round one more seed of every variant in an
open contrast, up to 8 seeds.

Three variants A, B, C on one lower-is-better metric (K = 3 contrasts, Bonferroni at alpha / 3). A seed's value is
mu_variant + normal noise with sd 1/sqrt(2), so one paired per-seed difference has sd 1: effects are in seed-sds.
Designs: A/A (all equal); C worse than A and B by 0.5, 1, 2, 10 and 30 sd (A vs B stays a null contrast); all
equal with a margin of 1 or 3 sd (equivalence); C worse by 1.5 sd with a margin of 1 sd (a wrong equivalence is
possible there). "real" contrasts are those with a right answer other than open (a winner, or equivalence).

Accuracy mode (--accuracy): what an eval task gives. Each run scores ITEMS items (default 200, a small cloze task)
0/1: item i has a difficulty b_i ~ N(0, DIFFICULTY_SD) shared by every run, run (variant v, seed k) an ability
ABILITY + shift_v + s_vk with a seed shift s_vk ~ N(0, SEED_SD) (seed noise), and its answer to item i is a Bernoulli
draw with P(right) = sigmoid(ability - b_i + z_vi) (item noise), z_vi the variant's persistent item quirk (0, or
~ N(0, quirk sd) drawn once per study: each variant answers some items better and others worse on every seed, zero
mean over the population of items: a population null). A run's score is its accuracy (higher is better). Each
contrast's per-seed differences and, at every prefix of its seeds, the noise model noise.paired_noise computes from
the (seeds, items) matrix of per-item differences (the fixed report's: fresh noise floors the per-seed variance,
the persistent item variance is added to the mean's, not divided by the seeds) go through the same confidence
sequence, decide_contrast, rounds and Bonferroni as above. Designs: A/A, with and without quirks; C better by 0.1
to 2 logits; "C = A + k items": k items no run gets right (b_i = +inf), C a copy of A's answers on every seed plus
those k right, so A vs C has identical per-seed differences k / ITEMS and no seed spread (a difference every seed
repeats; counted as a null: a wrong decision if decided); A/A and the k-item case also without the noise model
(floor and item variance 0).

    python scripts/simulate_sequential.py                       # 1000 studies per design (about a minute on one core)
    python scripts/simulate_sequential.py --smoke               # 50 per design
    python scripts/simulate_sequential.py --accuracy            # the accuracy designs, 1000 studies each
    python scripts/simulate_sequential.py --accuracy --smoke
    python scripts/simulate_sequential.py --designs             # group-sequential vs anytime vs fixed 8 seeds
    python scripts/simulate_sequential.py --spendings [FAMILY ...]  # spending families (Holm, futility 0.1) vs fixed
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from simulate_sequential_comparisons import (
    SPENDING_CHOICES,
    compare_designs,
    compare_item_shares,
    compare_spendings,
    fmt_number,
)
from simulate_sequential_studies import (
    ABILITY,
    DIFFICULTY_SD,
    FIRST_ROUND,
    ITEMS,
    MAX_SEEDS,
    SEED_SD,
    simulate,
    simulate_accuracy,
)


QUIRK_SDS = (1.0, 1.5)  # the population null's persistent item quirks (logits)


def accuracy_designs(items: int) -> list[tuple[str, float, int, bool, float]]:
    """(name, shift in logits, copied items, noise model on, quirk sd) of the accuracy mode's designs."""
    designs = [("A/A", 0.0, 0, True, 0.0), ("A/A, no noise model", 0.0, 0, False, 0.0)]
    designs += [(f"A/A, item quirks sd {q:g}", 0.0, 0, True, q) for q in QUIRK_SDS]
    designs += [(f"A/A, item quirks sd {QUIRK_SDS[0]:g}, no noise model", 0.0, 0, False, QUIRK_SDS[0])]
    designs += [(f"C better by {d:g} logit", d, 0, True, 0.0) for d in (0.1, 0.25, 0.5, 1.0, 2.0)]
    designs += [(f"C better by {d:g} logit, quirks sd {QUIRK_SDS[0]:g}", d, 0, True, QUIRK_SDS[0]) for d in (1.0, 2.0)]
    for k in (3, 10):
        designs += [(f"C = A + {k} of {items} items", 0.0, k, True, 0.0)]
    designs += [(f"C = A + 3 of {items} items, no noise model", 0.0, 3, False, 0.0)]
    return designs


def _header(studies: int, alpha: float, seconds: float, what: str) -> None:
    print(
        f"{studies} studies per design; {what}3 variants, K = 3 contrasts at alpha {alpha:g} / 3; round 1: "
        f"{FIRST_ROUND} seeds, then +1 seed per open variant, at most {MAX_SEEDS}; fixed design: {MAX_SEEDS} seeds "
        f"x 3 variants ({seconds:.0f}s)"
    )


def _row(r: dict) -> str:
    cum = " | ".join(fmt_number(x, 2) for x in r["by_round"]) if r["by_round"] else " | ".join(["n/a"] * 6)
    return (
        f"{fmt_number(r['wrong_any'])} | {fmt_number(r['right'])} | {fmt_number(r['wrong'])} | "
        f"{fmt_number(r['seeds_at_decision'], 2)} | "
        f"{r['seeds_share']:.0%} | {cum} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--studies", type=int, default=1000)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="50 studies per design")
    parser.add_argument("--accuracy", action="store_true", help="the accuracy-metric designs (0/1 items)")
    parser.add_argument("--items", type=int, default=ITEMS, help="items per run in --accuracy (default 200)")
    parser.add_argument("--designs", action="store_true", help="group-sequential vs anytime vs fixed 8 seeds")
    parser.add_argument("--spendings", nargs="*", metavar="SPENDING", help="the spending families' power table")
    parser.add_argument("--item-shares", action="store_true", help="only --designs' item-share table")
    args = parser.parse_args()
    studies = 50 if args.smoke else args.studies
    rng = np.random.default_rng(args.seed)
    if args.spendings is not None:
        return compare_spendings(studies, args.alpha, args.seed, tuple(args.spendings) or SPENDING_CHOICES)
    if args.item_shares:
        return compare_item_shares(studies, args.alpha, rng)
    if args.designs:
        compare_designs(studies, args.alpha, rng)
        return compare_item_shares(studies, args.alpha, rng)
    se = math.sqrt(args.alpha * (1 - args.alpha) / studies)
    rounds = " | ".join(f"by r{k + 1}" for k in range(MAX_SEEDS - FIRST_ROUND + 1))
    columns = "any wrong decision | real decided right | real decided wrong | seeds at decision | compute vs fixed"
    rule = "|---|---|---|---|---|---|" + "---|" * (MAX_SEEDS - FIRST_ROUND + 1)
    start = time.perf_counter()
    if args.accuracy:
        designs = accuracy_designs(args.items)
        rows = [
            simulate_accuracy(name, shift, studies, args.alpha, rng, args.items, copied, floor, quirks)
            for name, shift, copied, floor, quirks in designs
        ]
        _header(
            studies,
            args.alpha,
            time.perf_counter() - start,
            f"accuracy on {args.items} 0/1 items (difficulty sd {DIFFICULTY_SD:g}, ability {ABILITY:g}, seed sd "
            f"{SEED_SD:g} logit); ",
        )
        print(
            f"| design | C - A (acc) | sd of A - C per seed / fresh sd / item sd | no interval | {columns} | {rounds} |"
        )
        print("|---|---|---|---" + rule)
        for r in rows:
            print(
                f"| {r['design']} | {r['planted']:+.4f} | {r['sd_diff']:.4f} / {r['floor_sd']:.4f} / "
                f"{r['item_sd']:.4f} | {r['no_interval']:.2f} | {_row(r)}"
            )
        nulls = [r for (_, shift, copied, floor, _), r in zip(designs, rows) if not copied and floor]
        worst = max(r["wrong_any"] for r in nulls)
        print(
            f"largest any-wrong-decision share of the null designs under the noise model: {worst:.3f} (alpha "
            f"{args.alpha:g}; one "
            f"standard error {se:.3f})"
        )
        return
    designs = [("A/A", 0.0, None)] + [(f"C worse by {d:g} sd", d, None) for d in (0.5, 1, 2, 10, 30)]
    designs += [(f"all equal, margin {m:g} sd", 0.0, m) for m in (1.0, 3.0)]
    designs += [("C worse by 1.5 sd, margin 1 sd", 1.5, 1.0)]
    rows = [simulate(name, effect, margin, studies, args.alpha, rng) for name, effect, margin in designs]
    _header(studies, args.alpha, time.perf_counter() - start, "")
    print(f"| design | {columns} | {rounds} |")
    print(rule)
    for r in rows:
        print(f"| {r['design']} | {_row(r)}")
    worst = max(r["wrong_any"] for r in rows)
    print(f"largest any-wrong-decision share: {worst:.3f} (alpha {args.alpha:g}; one standard error {se:.3f})")


if __name__ == "__main__":
    main()
