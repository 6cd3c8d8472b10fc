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
import dataclasses
import math
import time

import numpy as np

from ablate.report.sections.sequential.decide import (
    FUTILE,
    Contrast,
    decide,
    decide_contrast,
    decide_study,
    open_variants,
)
from ablate.report.sections.sequential.rule import DecisionRule
from ablate.report.stats.noise import paired_noise

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


def run_rounds(
    prefixes_of,
    alpha: float,
    margin: float | None,
    lower_is_better: bool,
    metric: str,
    rule=None,
    variants=VARIANTS,
    first: int = FIRST_ROUND,
    recycle: bool = True,
) -> dict:
    """The study's round logic: round 1 gives every variant `first` seeds, each later round one more seed to every
    variant in an open contrast (up to the rule's max_seeds, MAX_SEEDS without a rule); after each round every
    contrast is decided by decide_contrast through decide_study (Holm's recycling from alpha / K under a
    group-sequential rule unless recycle=False, else Bonferroni; rule: its design, None: anytime; looks: the paired
    seeds after each round that changed them) from prefixes_of(a, b, n): [(per-seed differences of the first k seeds,
    floor_var[, item_var])] for k = 2..n, the seeds both ran."""
    most = rule.max_seeds if rule is not None else MAX_SEEDS
    pairs = [(a, b) for i, a in enumerate(variants) for b in variants[i + 1 :]]
    seeds = dict.fromkeys(variants, first)
    looks: dict[tuple[str, str], list[int]] = {pair: [] for pair in pairs}
    decided_round: dict[tuple[str, str], int] = {}
    rounds = 0
    while True:
        rounds += 1
        inputs = []
        for a, b in pairs:
            n = min(seeds[a], seeds[b])  # seeds are added in order: the shared ones are the first n
            if not looks[(a, b)] or looks[(a, b)][-1] != n:
                looks[(a, b)].append(n)
            inputs.append((prefixes_of(a, b, n), looks[(a, b)]))

        def decide_at(i: int, level: float, inputs=inputs) -> tuple:
            return decide_contrast(inputs[i][0], level, margin, lower_is_better, rule, inputs[i][1])

        holm = recycle and rule is not None and rule.design != "anytime"
        results, _ = decide_study(len(pairs), alpha, decide_at, holm)
        contrasts = []
        for (a, b), (prefixes, _), (decision, interval, *_) in zip(pairs, inputs, results):
            if decision != FUTILE:
                assert decision == decide(interval, margin, lower_is_better)
            estimate = float(np.mean(prefixes[-1][0]))
            contrasts.append(Contrast(a, b, metric, decision, len(prefixes[-1][0]), interval, estimate, margin))
            if decision not in ("open", FUTILE):
                decided_round.setdefault((a, b), rounds)
        grow = [v for v in open_variants(contrasts) if seeds[v] < most]
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
    prefix under noise.paired_noise of its (seeds, items) per-item differences (floor=False: no noise model)."""
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
            if c.decision not in ("open", FUTILE) and c.decision != want:
                bad = True
            if want != "open":
                real += 1
                if c.decision == want:
                    right += 1
                    decided_at.append(c.seeds)
                    by_round[study["decided_round"][(c.a, c.b)] - 1 :] += 1
                elif c.decision not in ("open", FUTILE):
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


# ---------------------------------------------------------------------------------------------------------------
# --designs: the group-sequential design, the anytime one and a fixed 8-seed design side by side


def gaussian_study(rng, means: dict, alpha: float, margin, rule, item_var: float = 0.0, first: int = FIRST_ROUND):
    """One study of len(means) variants on a lower-is-better metric: seed k of variant v gives means[v] + the
    variant's item-set offset (N(0, item_var / 2), the same on every seed) + N(0, 1/2), so a per-seed difference has
    sd 1 and the mean difference a persistent item part of variance item_var (known to the decision, as the noise
    model's item term). The study's design decides with Holm's recycling; the fixed one (round 1 at max_seeds) with
    Bonferroni, as the fixed report does."""
    most = rule.max_seeds
    values = {}
    for v, mu in means.items():
        offset = rng.normal(0, math.sqrt(item_var / 2)) if item_var else 0.0
        values[v] = mu + offset + rng.normal(0, math.sqrt(0.5), most)

    def prefixes_of(a: str, b: str, n: int) -> list[tuple[list[float], float, float]]:
        diffs = list(values[a][:n] - values[b][:n])
        return [(diffs[:k], 0.0, item_var) for k in range(2, n + 1)]

    recycle = first < most  # the fixed design (one look, at max_seeds) is the fixed report's test: Bonferroni
    return run_rounds(prefixes_of, alpha, margin, True, "val_loss", rule, tuple(means), first, recycle)


def true_statement(decision: str, diff: float, margin) -> bool:
    """Whether a decision on mean(a - b) (lower is better) is true of the real difference `diff`."""
    if decision == "a":
        return diff < 0
    if decision == "b":
        return diff > 0
    return margin is not None and abs(diff) < margin  # equivalent


def tally_designs(means: dict, margin, studies: int, alpha: float, rng, rule, item_var: float, first: int) -> dict:
    """any-wrong share, the share of real contrasts (a true decision exists) decided with a true decision, seeds
    used, and compute against a fixed design of max_seeds seeds for every variant."""
    wrong_any = right = real = 0
    used = []
    for _ in range(studies):
        study = gaussian_study(rng, means, alpha, margin, rule, item_var, first)
        used.append(study["seeds"])
        bad = False
        for c in study["contrasts"]:
            diff = means[c.a] - means[c.b]
            decided = c.decision not in ("open", FUTILE)
            bad |= decided and not true_statement(c.decision, diff, margin)
            if diff != 0 or (margin is not None and abs(diff) < margin):
                real += 1
                right += decided and true_statement(c.decision, diff, margin)
        wrong_any += bad
    return {
        "wrong_any": wrong_any / studies,
        "right": right / real if real else None,
        "seeds": float(np.mean(used)),
        "compute": float(np.mean(used)) / (rule.max_seeds * len(means)),
    }


def design_rules(spending: str | None = None, futility: float | None = None) -> dict:
    """The designs compared: (rule, seeds of round 1) by name; the fixed design is one look at max_seeds."""
    gs = DecisionRule(max_seeds=MAX_SEEDS)
    gs = dataclasses.replace(
        gs, spending=spending or gs.spending, futility=gs.futility if futility is None else futility
    )
    return {
        "group-sequential": (gs, FIRST_ROUND),
        "anytime": (DecisionRule(max_seeds=MAX_SEEDS, design="anytime"), FIRST_ROUND),
        f"fixed {MAX_SEEDS} seeds": (DecisionRule(max_seeds=MAX_SEEDS, futility=0.0), MAX_SEEDS),
    }


def design_mixes() -> list[tuple[str, dict, float | None]]:
    """(name, variant -> true mean in seed-sds, margin) of the --designs mode."""
    mixes = []
    for size in (3, 6):
        names = "ABCDEF"[:size]
        for d in (0, 0.5, 1, 2, 4, 8):
            mixes.append(
                (f"{size} variants, {names[-1]} worse by {d:g}", {v: d * (v == names[-1]) for v in names}, None)
            )
    mixes.append(("M1: A = B, C worse by 4, margin 1", {"A": 0.0, "B": 0.0, "C": 4.0}, 1.0))
    mixes.append(("M2: six at 0, 0.8, ..., 4.0", {v: 0.8 * i for i, v in enumerate("ABCDEF")}, None))
    return mixes


def compare_designs(studies: int, alpha: float, rng) -> None:
    """The --designs mode's tables: every mix under each design, without and with an item term of half the seed
    variance; the spending families on the two fixed mixes; M2's futility trade-off."""
    print(f"{studies} studies per cell; alpha {alpha:g} over all contrasts (group-sequential: Holm's recycling; ")
    print(f"anytime and fixed: Bonferroni); max {MAX_SEEDS} seeds; ")
    print("effects in seed-sds of a per-seed difference; compute: seeds used / (variants x 8)\n")
    for item_var in (0.0, 0.5):
        print(f"item term: {'none' if not item_var else 'variance half the seed variance'}\n")
        rules = design_rules()
        head = " | ".join(f"{n}: any wrong / right / compute" for n in rules)
        print(f"| mix | {head} |\n|---|" + "---|" * len(rules))
        for name, means, margin in design_mixes():
            cells = []
            for rule, first in rules.values():
                r = tally_designs(means, margin, studies, alpha, rng, rule, item_var, first)
                cells.append(f"{_f(r['wrong_any'])} / {_f(r['right'], 2)} / {r['compute']:.0%}")
            print(f"| {name} | {' | '.join(cells)} |")
        print()
    print("spending families (no item term): right / compute, against the fixed design's right\n")
    families = ("pocock", "hsd:1", "hsd:-1", "hsd:-2", "obrien_fleming")
    print("| mix | fixed right | " + " | ".join(families) + " |\n|---|---|" + "---|" * len(families))
    for name, means, margin in [m for m in design_mixes() if m[0].startswith(("M1", "M2", "3 variants, C worse by 2"))]:
        rule, first = design_rules()[f"fixed {MAX_SEEDS} seeds"]
        fixed = tally_designs(means, margin, studies, alpha, rng, rule, 0.0, first)
        cells = []
        for family in families:
            rule, first = design_rules(spending=family)["group-sequential"]
            r = tally_designs(means, margin, studies, alpha, rng, rule, 0.0, first)
            cells.append(f"{_f(r['right'], 2)} / {r['compute']:.0%}")
        print(f"| {name} | {_f(fixed['right'], 2)} | {' | '.join(cells)} |")
    print("\nM2's futility trade-off (no item term): right / compute\n")
    name, means, margin = design_mixes()[-1]
    for futility in (0.0, 0.05, 0.1, 0.2, 0.3):
        rule, first = design_rules(futility=futility)["group-sequential"]
        r = tally_designs(means, margin, studies, alpha, rng, rule, 0.0, first)
        right, compute = _f(r["right"], 3), f"{r['compute']:.0%}"
        print(f"futility {futility:g}: any wrong {_f(r['wrong_any'])}, right {right}, compute {compute}")


SPENDING_CHOICES = ("hsd:-2", "hsd:-3", "hsd:-4", "obrien_fleming")  # --spendings' candidates


def power_mixes() -> list[tuple[str, dict, float | None]]:
    """(name, variant -> true mean in seed-sds, margin) of the --spendings mode: two A/A studies (the error) and the
    four mixes whose power the design must keep ("3 variants 1.5 sd apart" read both ways)."""
    return [
        ("3 variants, A/A", dict.fromkeys("ABC", 0.0), None),
        ("6 variants, A/A", dict.fromkeys("ABCDEF", 0.0), None),
        ("6 variants, F worse by 2", {v: 2.0 * (v == "F") for v in "ABCDEF"}, None),
        ("M2: six at 0, 0.8, ..., 4.0", {v: 0.8 * i for i, v in enumerate("ABCDEF")}, None),
        ("M1: A = B, C worse by 4, margin 1", {"A": 0.0, "B": 0.0, "C": 4.0}, 1.0),
        ("3 variants 1.5 sd apart (0, 1.5, 3)", {"A": 0.0, "B": 1.5, "C": 3.0}, None),
        ("3 variants, C worse by 1.5", {"A": 0.0, "B": 0.0, "C": 1.5}, None),  # the other reading of "1.5 sd apart"
    ]


def compare_spendings(studies: int, alpha: float, seed: int, spendings=SPENDING_CHOICES) -> None:
    """The --spendings mode's table: each spending family under the study's rules (Holm's recycling, futility at the
    default threshold) against the fixed max_seeds-seed design (Bonferroni), every cell on the same simulated
    studies (one seed per mix): any wrong, right as a share of the fixed design's right, compute."""
    print(f"{studies} studies per cell (the same studies in every column); alpha {alpha:g} over all contrasts; max ")
    print(f"{MAX_SEEDS} seeds; effects in seed-sds of a per-seed difference; no item term; cells: any wrong / right ")
    print(f"(share of the fixed design's) / compute (seeds used / (variants x {MAX_SEEDS}))\n")
    print("| mix | fixed 8 seeds: any wrong / right | " + " | ".join(spendings) + " |")
    print("|---|---|" + "---|" * len(spendings))
    for i, (name, means, margin) in enumerate(power_mixes()):
        rule, first = design_rules()[f"fixed {MAX_SEEDS} seeds"]
        fixed = tally_designs(means, margin, studies, alpha, np.random.default_rng([seed, i]), rule, 0.0, first)
        cells = []
        for family in spendings:
            rule, first = design_rules(spending=family)["group-sequential"]
            r = tally_designs(means, margin, studies, alpha, np.random.default_rng([seed, i]), rule, 0.0, first)
            share = f" ({r['right'] / fixed['right']:.0%})" if fixed["right"] else ""
            cells.append(f"{_f(r['wrong_any'])} / {_f(r['right'], 3)}{share} / {r['compute']:.0%}")
        print(f"| {name} | {_f(fixed['wrong_any'])} / {_f(fixed['right'], 3)} | {' | '.join(cells)} |", flush=True)


ITEM_SHARES = (0.0, 0.1, 0.5, 2.0)  # tau^2 / sigma^2: the item-set variance of the mean difference / the seeds'


def item_share_mixes() -> list[tuple[str, dict, float | None]]:
    """(name, variant -> true mean in seed-sds, margin) of the item-share scenarios."""
    return [
        ("6 variants, all equal", dict.fromkeys("ABCDEF", 0.0), None),
        ("6 variants, F worse by 3", {v: 3.0 * (v == "F") for v in "ABCDEF"}, None),
        ("3 variants, C worse by 2", {"A": 0.0, "B": 0.0, "C": 2.0}, None),
    ]


def fixed_report_test(means: dict, studies: int, alpha: float, rng, item_var: float) -> dict:
    """The fixed report's own test on max_seeds seeds of every variant, Bonferroni over the pairs: t = mean /
    sqrt((s^2 + n tau^2) / n) on n - 1 degrees of freedom (noise.seed_test's noise model), values drawn as
    gaussian_study draws them. any-wrong share and the share of real contrasts decided on their true side."""
    from scipy.stats import t as student

    names, n = list(means), MAX_SEEDS
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    critical = student.ppf(1 - alpha / len(pairs) / 2, n - 1)
    offsets = rng.normal(0, math.sqrt(item_var / 2), (studies, len(names)))
    values = np.array([means[v] for v in names])[None, :, None] + offsets[:, :, None]
    values = values + rng.normal(0, math.sqrt(0.5), (studies, len(names), n))
    wrong, right, real = np.zeros(studies, dtype=bool), 0, 0
    for a, b in pairs:
        d = values[:, names.index(a)] - values[:, names.index(b)]
        t = d.mean(axis=1) / np.sqrt((d.var(axis=1, ddof=1) + n * item_var) / n)
        diff = means[a] - means[b]
        decided = np.abs(t) > critical
        true_side = np.sign(t) == np.sign(diff)
        wrong |= decided & ~true_side
        if diff:
            real += studies
            right += int((decided & true_side).sum())
    return {"wrong_any": float(wrong.mean()), "right": right / real if real else None}


def seeds_only(run):
    """run() with the boundaries of the seeds alone (the item term ignored in the critical |t|: the rule before
    group_sequential.combined_critical), for comparison."""
    from ablate.report.stats import group_sequential

    combined = group_sequential.boundaries
    group_sequential.boundaries = lambda *args, noise=None, **kwargs: combined(*args, **kwargs)
    try:
        return run()
    finally:
        group_sequential.boundaries = combined


NULL_SHARES = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
NULL_LEVELS = ((0.05 / 3, "hsd:-2"), (0.05 / 15, "hsd:-2"), (0.05 / 3, "obrien_fleming"), (0.05, "pocock"))


def null_crossings(studies: int, seed: int = 1) -> None:
    """One contrast under no difference, looks 3..8 of 8, `studies` studies a cell (vectorized): the share of studies
    whose repeated interval misses the truth at some look, in units of the contrast's alpha, at each item share
    (tau^2 / sigma^2: per-seed N(0, 1) differences plus one item offset N(0, share) on every seed, the item
    variance known, the seeds' estimated), with each look's critical |t| combining the seeds' and the item part's
    boundaries, and (in brackets) with the seeds' boundaries alone. seed: not 0, the boundaries' own simulation."""
    from ablate.report.stats import group_sequential as gs

    looks = np.arange(FIRST_ROUND, MAX_SEEDS + 1)
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((studies, MAX_SEEDS))
    sums, squares = np.cumsum(noise, axis=1)[:, looks - 1], np.cumsum(noise * noise, axis=1)[:, looks - 1]
    means = sums / looks
    variances = (squares - looks * means * means) / (looks - 1)
    offset = rng.standard_normal((studies, 1))
    print(f"\none contrast under no difference ({studies} studies a cell): misses / alpha, combined (seeds' alone)\n")
    print("| alpha | spending | " + " | ".join(f"share {r:g}" for r in NULL_SHARES) + " |")
    print("|---|---|" + "---|" * len(NULL_SHARES))
    for level, spending in NULL_LEVELS:
        seeds = np.array(gs.boundaries(tuple(looks), MAX_SEEDS, level, spending))
        cells = []
        for share in NULL_SHARES:
            size = np.abs(means + math.sqrt(share) * offset)
            se = np.sqrt(variances / looks + share)
            combined = gs.combined_critical(seeds, gs.item_critical(level), variances, share, looks)
            now, before = ((size >= c * se).any(axis=1).mean() / level for c in (combined, seeds))
            cells.append(f"{now:.2f} ({before:.2f})")
        print(f"| {level:.4f} | {spending} | " + " | ".join(cells) + " |")


def compare_item_shares(studies: int, alpha: float, rng) -> None:
    """The item-share table: at each share tau^2 / sigma^2 (known to the decision, as the noise model's item term),
    each mix under the group-sequential design (its boundaries combining the seeds' and the item part's), the same
    with the seeds' boundaries alone (the rule before), the fixed design through the decision code, and the fixed
    report's own t-test on 8 seeds; then null_crossings at 100 x `studies` studies a cell (200,000 at most)."""
    rules = design_rules()
    gs_rule, gs_first = rules["group-sequential"]
    print(
        f"\nitem shares ({studies} studies per cell; alpha {alpha:g}; {gs_rule.spending} spending, futility "
        f"{gs_rule.futility:g}): any wrong / right / compute\n"
    )
    fixed_rule, fixed_first = rules[f"fixed {MAX_SEEDS} seeds"]
    print(
        "| share | mix | group-sequential | seeds-only boundaries (before) | fixed 8 seeds (decision code) | "
        "fixed report's t-test, 8 seeds |\n|---|---|---|---|---|---|"
    )
    for share in ITEM_SHARES:
        for name, means, margin in item_share_mixes():
            cells = []
            designs = ((gs_rule, gs_first, False), (gs_rule, gs_first, True), (fixed_rule, fixed_first, False))
            for rule, first, before in designs:
                args = (means, margin, studies, alpha, rng, rule, share, first)
                r = seeds_only(lambda: tally_designs(*args)) if before else tally_designs(*args)  # noqa: B023
                cells.append(f"{_f(r['wrong_any'])} / {_f(r['right'], 3)} / {r['compute']:.0%}")
            r = fixed_report_test(means, studies, alpha, rng, share)
            cells.append(f"{_f(r['wrong_any'])} / {_f(r['right'], 3)} / 100%")
            print(f"| {share:g} | {name} | {' | '.join(cells)} |")
    null_crossings(min(200_000, 100 * studies))


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
