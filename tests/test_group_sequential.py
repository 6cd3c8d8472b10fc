"""The group-sequential design (ablate.report.inference.group_sequential, decided through sequential.decide_prefixes
and the study's round logic in scripts/simulate_sequential.py): alpha spending, boundaries calibrated for the t
against a fresh simulation, A/A at the default within alpha, equivalence and futility exercised, and what an item
term does to the seeds' own schedule."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from ablate.report.inference import group_sequential as gs
from ablate.report.inference.sequential import DecisionRule, decide_prefixes

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "simulate_sequential.py"
sys.path.insert(0, str(SCRIPT.parent))
import simulate_sequential as sim  # noqa: E402  (the study loop: the same decision code as a study)

LOOKS = tuple(range(3, 9))


@pytest.mark.parametrize("spending", ["pocock", "obrien_fleming", "hsd:-2", "hsd:1", "hsd:0"])
def test_spending_starts_at_zero_ends_at_alpha_and_rises(spending):
    values = [gs.spent(f, 0.01, spending) for f in np.linspace(0, 1, 21)]
    assert values[0] == 0 and values[-1] == pytest.approx(0.01) and all(b >= a for a, b in zip(values, values[1:]))


def test_obrien_fleming_spends_late_and_pocock_early():
    assert 10 * gs.spent(0.375, 0.05, "obrien_fleming") < gs.spent(0.375, 0.05, "pocock")


def test_a_spending_that_is_none_of_them_names_the_allowed_ones():
    for bad in ("linear", "hsd:x", "hsd:"):
        with pytest.raises(ValueError, match="allowed: pocock, obrien_fleming, hsd:G"):
            gs.check_spending(bad)
    with pytest.raises(ValueError, match="spending"):
        DecisionRule(spending="linear").check("f")


def test_boundaries_hold_their_spending_in_a_fresh_simulation():
    """The calibrated c_k, applied to studies simulated with another seed: the share first crossing at each look is
    what the spending allows there, within Monte Carlo error (binomial, 4 standard errors of both simulations)."""
    alpha = 0.05 / 3
    bounds = gs.boundaries(LOOKS, 8, alpha, "hsd:-2")
    studies = 200_000
    t = np.abs(gs.simulated_t(LOOKS, 0.0, studies, seed=7))
    running, before = np.ones(studies, dtype=bool), 0.0
    for k, n in enumerate(LOOKS):
        allowed = gs.spent(n / 8, alpha, "hsd:-2") - before
        before += allowed
        crossed = running & (t[:, k] >= bounds[k])
        se = math.sqrt(max(allowed, 1e-6) / studies)
        assert abs(crossed.mean() - allowed) < 4 * math.sqrt(2) * se, (n, crossed.mean(), allowed)
        running &= ~crossed
    assert 1 - running.mean() == pytest.approx(alpha, abs=4 * math.sqrt(2 * alpha / studies))


def test_boundaries_are_for_the_t_not_the_normal():
    """At 2 degrees of freedom the t's tails are far heavier than z's: a z boundary at the same p would be ~3x too
    small at the first look."""
    alpha = 0.05 / 3
    first = gs.boundaries(LOOKS, 8, alpha, "pocock")[0]
    z = gs._normal_quantile(1 - gs.spent(3 / 8, alpha, "pocock") / 2)
    assert first > 3 * z
    assert gs.boundaries([8], 8, 0.05, "pocock")[0] == pytest.approx(2.365, abs=0.03)  # one look: t_7's quantile


def test_a_skipped_look_spends_by_its_own_fraction():
    """Looks at 3, 5 and 8 seeds (a round that trained no seed of the pair, a round skipped): each look's boundary
    spends up to its own information fraction, so the total is still alpha."""
    bounds = gs.boundaries([3, 5, 8], 8, 0.01, "hsd:-2")
    t = np.abs(gs.simulated_t((3, 5, 8), 0.0, 200_000, seed=3))
    crossed = (t >= np.array(bounds)).any(axis=1).mean()
    assert crossed == pytest.approx(0.01, abs=4 * math.sqrt(2 * 0.01 / 200_000))


def test_an_item_term_keeps_the_seeds_schedule_conservative():
    """The decision calibrates for seeds alone (rho = 0): with an item term the known n tau^2 in the t's denominator
    lightens its tails, so the seeds' boundaries are crossed less often than alpha."""
    bounds = np.array(gs.boundaries(LOOKS, 8, 0.01, "hsd:-2"))
    for rho in (0.1, 0.5, 2.0):
        t = np.abs(gs.simulated_t(LOOKS, rho, 100_000, seed=11))
        assert (t >= bounds).any(axis=1).mean() <= 0.01


def test_aa_studies_under_the_default_claim_at_most_alpha():
    """Six equal variants (15 contrasts) through the study's rounds at the default design: any wrong decision in at
    most alpha + 2 standard errors of 200 studies."""
    rule, first = sim.design_rules()["group-sequential"]
    assert rule.design == DecisionRule().design == "group_sequential" and rule.spending == DecisionRule().spending
    result = sim.tally_designs(
        dict.fromkeys("ABCDEF", 0.0), None, 200, 0.05, np.random.default_rng(21), rule, 0.0, first
    )
    assert result["wrong_any"] <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 200)
    assert result["compute"] < 0.6  # futility closed the null contrasts: their variants stopped getting seeds


def test_equivalence_is_decided_inside_the_margin_and_a_loser_is_dropped_early():
    """Twins A = B with a margin of 3 seed-sds end equivalent in most studies (a side only as the rare wrong
    decision alpha allows); a loser C worse by 4 sd is decided worse than both in nearly all; every study uses less
    compute than a fixed 8-seed design."""
    rule, first = sim.design_rules()["group-sequential"]
    rng = np.random.default_rng(5)
    decisions = {("A", "B"): [], ("A", "C"): []}
    for _ in range(60):
        study = sim.gaussian_study(rng, {"A": 0.0, "B": 0.0, "C": 4.0}, 0.05, 3.0, rule, 0.0, first)
        for c in study["contrasts"]:
            decisions.get((c.a, c.b), []).append(c.decision)
        assert study["seeds"] < 3 * 8
    twins, loser = decisions[("A", "B")], decisions[("A", "C")]
    assert twins.count("equivalent") >= 40 and twins.count("a") + twins.count("b") <= 3
    assert loser.count("a") >= 55 and "b" not in loser


def test_futility_closes_a_contrast_that_cannot_be_decided_and_zero_turns_it_off():
    """Per-seed differences around 0 with sd 1 at 3 seeds of 8: the chance to decide by 8 is small, so the contrast
    closes as undecidable; with futility 0 it stays open; a large difference is decided instead."""
    diffs = [0.3, -0.5, 0.4]
    prefixes = [(diffs[:k], 0.0, 0.0) for k in range(2, 4)]
    closing, keeping = DecisionRule(futility=0.1), DecisionRule(futility=0.0)
    assert decide_prefixes(prefixes, 0.05, None, True, closing, [3])[0] == "undecidable"
    assert decide_prefixes(prefixes, 0.05, None, True, keeping, [3])[0] == "open"
    big = [(list(np.array(d) + 40), 0.0, 0.0) for d, *_ in prefixes]
    decision, interval, decided_at, boundary = decide_prefixes(big, 0.05, None, True, closing, [3])
    assert decision == "b" and decided_at == 3 and interval[0] > 0 and math.isfinite(boundary)
    chance = gs.decision_chance(0.07, 1.0, 0.0, 3, 8, 2.5)
    assert 0 < chance < 0.1 and gs.decision_chance(5.0, 1.0, 0.0, 3, 8, 2.5) > 0.9


def test_the_designs_comparison_prints_every_table(capsys):
    """scripts/simulate_sequential.py --designs at 2 studies a cell: every mix under each design, with and without
    an item term, the spending families and M2's futility trade-off."""
    sim.compare_designs(2, 0.05, np.random.default_rng(0))
    out = capsys.readouterr().out
    assert out.count("| M2: six at 0, 0.8, ..., 4.0 |") == 3 and out.count("| 6 variants, F worse by 8 |") == 2
    assert "| mix | fixed right | pocock | hsd:1 | hsd:-1 | hsd:-2 | obrien_fleming |" in out
    assert out.count("futility ") >= 5
