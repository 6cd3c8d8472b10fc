"""Adaptive studies simulated through the decision code `ablate run --until-decided` and `ablate report` use
(ablate.report.inference.sequential: the confidence sequence, its running intersection, decide, open_variants), with the
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
contrast's per-seed differences and, at every prefix of its seeds, the noise model stats.paired_noise computes from
the (seeds, items) matrix of per-item differences (the fixed report's: fresh noise floors the per-seed variance,
the persistent item variance is added to the mean's, not divided by the seeds) go through the same confidence
sequence, decide_prefixes, rounds and Bonferroni as above. Designs: A/A, with and without quirks; C better by 0.1
to 2 logits; "C = A + k items": k items no run gets right (b_i = +inf), C a copy of A's answers on every seed plus
those k right, so A vs C has identical per-seed differences k / ITEMS and no seed spread (a difference every seed
repeats; counted as a null: a wrong decision if decided); A/A and the k-item case also without the noise model
(floor and item variance 0).

    python scripts/simulate_sequential.py                       # 1000 studies per design (about a minute on one core)
    python scripts/simulate_sequential.py --smoke               # 50 per design
    python scripts/simulate_sequential.py --accuracy            # the accuracy designs, 1000 studies each
    python scripts/simulate_sequential.py --accuracy --smoke
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from ablate.report.inference.sequential import Contrast, decide, decide_prefixes, open_variants
from ablate.report.inference.stats import paired_noise

VARIANTS = ("A", "B", "C")
PAIRS = [("A", "B"), ("A", "C"), ("B", "C")]
FIRST_ROUND, MAX_SEEDS = 3, 8
ITEMS, ABILITY, DIFFICULTY_SD, SEED_SD = 200, 0.5, 1.5, 0.05  # accuracy mode: logit scale


def truth(a: str, b: str, effect: float, margin: float | None) -> str:
    """The right decision for mean(a - b), lower is better: C is worse (higher) by `effect`."""
    diff = (effect if a == "C" else 0.0) - (effect if b == "C" else 0.0)
    if margin is not None and abs(diff) < margin:
        return "equivalent"
    return "open" if diff == 0 else ("a" if diff < 0 else "b")


def run_study(rng, effect: float, alpha: float, margin: float | None) -> dict:
    """One study, round by round, until no contrast is open or no open variant may get another seed."""
    mu = {"A": 0.0, "B": 0.0, "C": effect}
    values = {v: mu[v] + rng.normal(0, math.sqrt(0.5), MAX_SEEDS) for v in VARIANTS}  # seed k's value, fixed

    def prefixes_of(a: str, b: str, n: int) -> list[tuple[list[float], float]]:
        diffs = list(values[a][:n] - values[b][:n])
        return [(diffs[:k], 0.0) for k in range(2, n + 1)]

    return run_rounds(prefixes_of, alpha, margin, lower_is_better=True, metric="val_loss")


def run_rounds(prefixes_of, alpha: float, margin: float | None, lower_is_better: bool, metric: str) -> dict:
    """The study's round logic: round 1 gives every variant FIRST_ROUND seeds, each later round one more seed to
    every variant in an open contrast (up to MAX_SEEDS); after each round every contrast is decided by
    decide_prefixes at alpha / K from prefixes_of(a, b, n): [(per-seed differences of the first k seeds, floor_var)
    for k = 2..n], the seeds both ran."""
    seeds = dict.fromkeys(VARIANTS, FIRST_ROUND)
    decided_round: dict[tuple[str, str], int] = {}
    rounds = 0
    while True:
        rounds += 1
        contrasts = []
        for a, b in PAIRS:
            n = min(seeds[a], seeds[b])  # seeds are added in order: the shared ones are the first n
            prefixes = prefixes_of(a, b, n)
            decision, interval, _ = decide_prefixes(prefixes, alpha / len(PAIRS), margin, lower_is_better)
            assert decision == decide(interval, margin, lower_is_better)
            estimate = float(np.mean(prefixes[-1][0]))
            contrasts.append(Contrast(a, b, metric, decision, n, interval, estimate, margin))
            if decision != "open":
                decided_round.setdefault((a, b), rounds)
        grow = [v for v in open_variants(contrasts) if seeds[v] < MAX_SEEDS]
        if not grow:
            break
        for v in grow:
            seeds[v] += 1
    return {"contrasts": contrasts, "rounds": rounds, "decided_round": decided_round, "seeds": sum(seeds.values())}


def accuracy_answers(rng, shift: float, items: int = ITEMS, copied: int = 0, quirk_sd: float = 0.0) -> dict:
    """Every variant's (MAX_SEEDS, items) 0/1 answers (seed k's row fixed before the study looks), and the planted
    accuracy difference C - A over the population of items (without seed noise or quirks). copied: the k-item case
    (shift 0): k items no run gets right, C = A's answers on every seed plus those k right. quirk_sd: the sd of
    each variant's persistent per-item quirk (logits)."""
    difficulty = rng.normal(0, DIFFICULTY_SD, items)
    if copied:
        difficulty[rng.choice(items, copied, replace=False)] = math.inf
    ability = {"A": ABILITY, "B": ABILITY, "C": ABILITY + shift}
    answers = {}
    for v in VARIANTS:
        quirk = rng.normal(0, quirk_sd, items) if quirk_sd else 0.0  # the same on every seed of the variant
        run_ability = ability[v] + rng.normal(0, SEED_SD, (MAX_SEEDS, 1))  # the seed's run-level shift
        answers[v] = (rng.random((MAX_SEEDS, items)) < _sigmoid(run_ability - difficulty + quirk)).astype(float)
    planted = _population_gap(ability["C"] - ability["A"], quirk_sd) if not copied else 0.0
    if copied:
        answers["C"] = answers["A"].copy()
        answers["C"][:, np.isinf(difficulty)] = 1.0
        planted = copied / items
    return {"answers": answers, "planted": planted}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _population_gap(shift: float, quirk_sd: float) -> float:
    """C - A in accuracy over the population of items and quirks (a fine grid over difficulty and quirk)."""
    z = np.linspace(-6, 6, 241)
    weight = np.exp(-z * z / 2)
    b, q = np.meshgrid(DIFFICULTY_SD * z, quirk_sd * z)
    w = np.outer(weight, weight) / weight.sum() ** 2
    return float(np.sum(w * (_sigmoid(ABILITY + shift - b + q) - _sigmoid(ABILITY - b + q))))


def _noise(per_item: np.ndarray) -> tuple[float, float]:
    """(fresh floor of one per-seed difference, persistent item variance of the mean) of a (seeds, items) matrix of
    per-item differences, as the fixed report's seed test computes them."""
    noise = paired_noise(per_item.mean(axis=1), per_item)
    return noise["fresh_var"], noise["item_var"]


def run_accuracy_study(
    rng, shift: float, alpha: float, items: int = ITEMS, copied: int = 0, floor: bool = True, quirk_sd: float = 0.0
) -> dict:
    """One study on accuracy (higher is better) through run_rounds: per-seed run-level accuracy differences, each
    prefix under stats.paired_noise of its (seeds, items) per-item differences (floor=False: no noise model)."""
    drawn = accuracy_answers(rng, shift, items, copied, quirk_sd)
    answers = drawn["answers"]

    def prefixes_of(a: str, b: str, n: int) -> list[tuple[list[float], float, float]]:
        per_item = answers[a][:n] - answers[b][:n]  # (seeds, items): paired per-item differences
        diffs = list(per_item.mean(axis=1))
        return [(diffs[:k], *(_noise(per_item[:k]) if floor else (0.0, 0.0))) for k in range(2, n + 1)]

    study = run_rounds(prefixes_of, alpha, None, lower_is_better=False, metric="quiz/acc")
    a_c = answers["A"] - answers["C"]  # every seed drawn: the spread a per-seed difference of A vs C has
    fresh, item_var = _noise(a_c)
    spread = {"sd_diff": float(a_c.mean(axis=1).std(ddof=1)), "floor_sd": math.sqrt(fresh), "item_sd": item_var**0.5}
    return {**study, "planted": drawn["planted"], **spread}


def truth_accuracy(a: str, b: str, shift: float) -> str:
    """The right decision for mean(a - b), higher is better: C is better by `shift` logits (the k-item case is a
    null: its shift is 0)."""
    diff = (shift if a == "C" else 0.0) - (shift if b == "C" else 0.0)
    return "open" if diff == 0 else ("a" if diff > 0 else "b")


def simulate(name: str, effect: float, margin: float | None, studies: int, alpha: float, rng) -> dict:
    return _tally(
        name, studies, lambda: run_study(rng, effect, alpha, margin), lambda a, b: truth(a, b, effect, margin)
    )


def simulate_accuracy(
    name: str,
    shift: float,
    studies: int,
    alpha: float,
    rng,
    items: int = ITEMS,
    copied: int = 0,
    floor: bool = True,
    quirk_sd: float = 0.0,
) -> dict:
    """simulate() for the accuracy mode; adds planted (C - A in accuracy), sd_diff, floor_sd and item_sd (means
    over studies: the sample sd of A - C's per-seed differences over MAX_SEEDS seeds, the fresh noise floor's sd and
    the persistent item sd of the mean difference) and no_interval (the share of final contrasts without an
    interval: equal per-seed differences and no noise model)."""
    keys = ("planted", "sd_diff", "floor_sd", "item_sd")
    extra = {**{key: [] for key in keys}, "no_interval": 0, "contrasts": 0}

    def one():
        study = run_accuracy_study(rng, shift, alpha, items, copied, floor, quirk_sd)
        for key in keys:
            extra[key].append(study[key])
        for c in study["contrasts"]:
            extra["contrasts"] += 1
            extra["no_interval"] += c.interval is None
        return study

    out = _tally(name, studies, one, lambda a, b: truth_accuracy(a, b, shift))
    for key in keys:
        out[key] = float(np.mean(extra[key]))
    out["no_interval"] = extra["no_interval"] / extra["contrasts"]
    return out


def _tally(name: str, studies: int, one, want_of) -> dict:
    """Runs `studies` studies (one() each) and counts their decisions against want_of(a, b)."""
    wrong_any = right = wrong = real = 0
    decided_at, used, by_round = [], [], np.zeros(MAX_SEEDS - FIRST_ROUND + 1)
    for _ in range(studies):
        study = one()
        used.append(study["seeds"])
        bad = False
        for c in study["contrasts"]:
            want = want_of(c.a, c.b)
            if c.decision != "open" and c.decision != want:
                bad = True
            if want != "open":
                real += 1
                if c.decision == want:
                    right += 1
                    decided_at.append(c.seeds)
                    by_round[study["decided_round"][(c.a, c.b)] - 1 :] += 1
                elif c.decision != "open":
                    wrong += 1
        wrong_any += bad
    return {
        "design": name,
        "studies": studies,
        "wrong_any": wrong_any / studies,
        "real": real,
        "right": right / real if real else None,
        "wrong": wrong / real if real else None,
        "seeds_at_decision": float(np.mean(decided_at)) if decided_at else None,
        "seeds_share": float(np.mean(used)) / (MAX_SEEDS * len(VARIANTS)),
        "by_round": (by_round / real).tolist() if real else None,
    }


def _f(x, digits=3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


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
    cum = " | ".join(_f(x, 2) for x in r["by_round"]) if r["by_round"] else " | ".join(["n/a"] * 6)
    return (
        f"{_f(r['wrong_any'])} | {_f(r['right'])} | {_f(r['wrong'])} | {_f(r['seeds_at_decision'], 2)} | "
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
    args = parser.parse_args()
    studies = 50 if args.smoke else args.studies
    rng = np.random.default_rng(args.seed)
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
