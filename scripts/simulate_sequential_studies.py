"""The simulated studies of scripts/simulate_sequential.py, run through the decision code `ablate run --until-decided`
and `ablate report` use (ablate.report.sections.sequential): the study's round logic (run_rounds), one study of
three variants on a lower-is-better metric (run_study) or on an eval task's 0/1 items (run_accuracy_study), one of
any variants under a given DecisionRule (gaussian_study), and the tallies that run many and count their decisions
against the truth (simulate, simulate_accuracy, tally_designs). Prints nothing.
"""

from __future__ import annotations

import math

import numpy as np

from ablate.report.sections.sequential.decide import (
    FUTILE,
    Contrast,
    decide,
    decide_contrast,
    decide_study,
    open_variants,
)
from ablate.report.stats.noise import paired_noise

VARIANTS = ("A", "B", "C")
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
    return noise.fresh_var, noise.item_var


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
# studies of any variants under a given rule: the --designs, --spendings and --item-shares modes' comparisons


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
