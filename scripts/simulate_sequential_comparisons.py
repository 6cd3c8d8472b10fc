"""The comparison tables of scripts/simulate_sequential.py: --designs (the group-sequential design, the anytime one
and a fixed 8-seed design side by side), --spendings (the spending families' power) and --item-shares (an item-set
variance known to the decision, and one contrast's null crossings), with the designs' rules and the mixes of true
means they run; the studies themselves are simulate_sequential_studies'.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ablate.report.sections.sequential.rule import DecisionRule
from simulate_sequential_studies import FIRST_ROUND, MAX_SEEDS, tally_designs


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
                cells.append(f"{fmt_number(r['wrong_any'])} / {fmt_number(r['right'], 2)} / {r['compute']:.0%}")
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
            cells.append(f"{fmt_number(r['right'], 2)} / {r['compute']:.0%}")
        print(f"| {name} | {fmt_number(fixed['right'], 2)} | {' | '.join(cells)} |")
    print("\nM2's futility trade-off (no item term): right / compute\n")
    name, means, margin = design_mixes()[-1]
    for futility in (0.0, 0.05, 0.1, 0.2, 0.3):
        rule, first = design_rules(futility=futility)["group-sequential"]
        r = tally_designs(means, margin, studies, alpha, rng, rule, 0.0, first)
        right, compute = fmt_number(r["right"], 3), f"{r['compute']:.0%}"
        print(f"futility {futility:g}: any wrong {fmt_number(r['wrong_any'])}, right {right}, compute {compute}")


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
            cells.append(f"{fmt_number(r['wrong_any'])} / {fmt_number(r['right'], 3)}{share} / {r['compute']:.0%}")
        print(
            f"| {name} | {fmt_number(fixed['wrong_any'])} / {fmt_number(fixed['right'], 3)} | {' | '.join(cells)} |",
            flush=True,
        )


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
                cells.append(f"{fmt_number(r['wrong_any'])} / {fmt_number(r['right'], 3)} / {r['compute']:.0%}")
            r = fixed_report_test(means, studies, alpha, rng, share)
            cells.append(f"{fmt_number(r['wrong_any'])} / {fmt_number(r['right'], 3)} / 100%")
            print(f"| {share:g} | {name} | {' | '.join(cells)} |")
    null_crossings(min(200_000, 100 * studies))


def fmt_number(x, digits=3) -> str:
    """x to `digits` decimal places, or n/a for None: a table cell."""
    return "n/a" if x is None else f"{x:.{digits}f}"
