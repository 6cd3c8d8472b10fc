"""Adaptive studies' statistics (ablate.report.sections.sequential): the safe t-test's e-value against its definition,
the confidence sequence and decisions, their error rates under optional stopping through the study's round logic
(scripts/simulate_sequential_studies.py), the decision rule, and contrasts read from run folders."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, stats

from ablate.report.stats.anytime import (
    MIXTURE_G,
    confidence_sequence,
    critical_t,
    e_value,
    e_value_sup,
    log_bayes_factor,
)
from ablate.report.sections.sequential.decide import decide, open_variants
from ablate.report.sections.sequential.rule import DecisionRule, parse_budget
from ablate.report.sections.sequential.section import folder_contrasts
from report_fixtures import STEPS, write_run

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "simulate_sequential.py"
sys.path.insert(0, str(SCRIPT.parent))
import simulate_sequential_studies as sim_studies  # noqa: E402  (the script's study loop: the same decision code)


def _bayes_factor_by_integral(t: float, n: int, g: float) -> float:
    """The Bayes factor from its definition: the noncentral-t density of t averaged over the effect's prior
    N(0, g) (noncentrality effect x sqrt(n)), over the central t density."""
    nu, sd = n - 1, math.sqrt(g)
    top = integrate.quad(
        lambda d: stats.nct.pdf(t, nu, d * math.sqrt(n)) * stats.norm.pdf(d, 0, sd),
        -10 * sd,
        10 * sd,
        points=[0.0, t / math.sqrt(n)],
        limit=400,
    )[0]
    return top / stats.t.pdf(t, nu)


@pytest.mark.parametrize("n,t,g", [(3, 2.0, 1.0), (5, 4.0, 10.0), (8, -1.5, 100.0), (4, 30.0, 1000.0)])
def test_bayes_factor_formula_matches_its_integral(n, t, g):
    assert math.exp(log_bayes_factor(t, n, g)) == pytest.approx(_bayes_factor_by_integral(t, n, g), rel=1e-6)


def test_a_huge_effect_is_decided_at_three_seeds_with_three_contrasts():
    """At n = 3 the mixture's supremum is mean(1 + 3 g) = 834 > K / alpha = 60: a 30-sd difference decides."""
    assert e_value_sup(3) == pytest.approx(np.mean([1 + 3 * g for g in MIXTURE_G]))
    assert e_value_sup(2) < 60  # two seeds never decide at alpha 0.05 / 3
    assert critical_t(2, 0.05 / 3) == math.inf and critical_t(3, 0.05 / 3) == pytest.approx(25.72, abs=0.01)
    assert e_value(critical_t(4, 0.05 / 3), 4) == pytest.approx(60)
    interval = confidence_sequence([30.5, 29.2, 30.8], 0.05 / 3)  # a - b: a's loss 30 sd higher
    assert interval is not None and interval[0] > 0
    assert decide(interval, None, lower_is_better=True) == "b"
    assert confidence_sequence([30.5], 0.05) is None


def test_aa_studies_with_optional_stopping_claim_at_most_alpha():
    """200 A/A studies through the round logic (3 seeds, +1 per open variant, up to 8; looking every round):
    the share with any claim stays <= alpha + 2 standard errors."""
    rng = np.random.default_rng(1)
    claims = sum(
        any(c.decision != "open" for c in sim_studies.run_study(rng, 0.0, 0.05, None)["contrasts"]) for _ in range(200)
    )
    assert claims / 200 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 200)


def test_a_planted_two_sd_effect_is_never_decided_the_wrong_way():
    result = sim_studies.simulate("2 sd", 2.0, None, 200, 0.05, np.random.default_rng(2))
    assert result["wrong"] == 0 and result["right"] > 0.3  # 0.55 over 2000 studies (docs/reports.md)


def test_equal_differences_without_a_floor_stay_open_and_with_one_follow_it():
    assert confidence_sequence([0.1, 0.1, 0.1], 0.05) is None  # no spread, no item noise: no evidence
    assert decide(confidence_sequence([0.1, 0.1, 0.1], 0.05), 1.0, True) == "open"
    # the persistent item variance is the mean's own: the items are the same on every seed, so seeds do not average
    # it away (item sd 0.00316: t = 31.6 > t* = 14.1)
    half = critical_t(3, 0.05) * math.sqrt(1e-5)
    assert confidence_sequence([0.1, 0.1, 0.1], 0.05, 0.0, 1e-5) == pytest.approx((0.1 - half, 0.1 + half))
    assert decide(confidence_sequence([0.1, 0.1, 0.1], 0.05, 0.0, 1e-5), None, True) == "b"
    assert decide(confidence_sequence([0.1, 0.1, 0.1], 0.05, 0.0, 1e-4), None, True) == "open"  # sd 0.01: t = 10
    # a difference of 2 item sds stays open however many seeds repeat it (t* >= 3.6 at every n; no overflow at 1000)
    for n in (3, 50, 1000):
        assert decide(confidence_sequence([0.02] * n, 0.05, 0.0, 1e-4), None, True) == "open"
    # the fresh floor bounds one per-seed difference's variance: that noise does average over seeds
    fresh = critical_t(3, 0.05) * math.sqrt(3e-4 / 3)
    assert confidence_sequence([0.1, 0.1, 0.1], 0.05, 3e-4) == pytest.approx((0.1 - fresh, 0.1 + fresh))


def test_equivalence_takes_precedence_and_direction_follows_the_metric():
    assert decide((0.001, 0.004), 0.01, lower_is_better=True) == "equivalent"  # excludes 0 too
    assert decide((0.001, 0.004), None, lower_is_better=True) == "b"
    assert decide((0.001, 0.004), None, lower_is_better=False) == "a"
    assert decide((-0.02, -0.015), 0.01, lower_is_better=True) == "a"
    assert decide((-0.005, 0.012), 0.01, lower_is_better=True) == "open"
    assert decide((-math.inf, math.inf), 0.01, lower_is_better=True) == "open"
    assert decide(None, 0.01, lower_is_better=True) == "open"


def test_decision_rule_round_trip_check_and_changes():
    rule = DecisionRule(metrics=("val_loss", "hellaswag/acc_per_char"), margins={"val_loss": 0.01}, budget="500M")
    assert DecisionRule.from_dict(rule.to_dict()) == rule
    rule.check("exp.py:3: decision")
    assert DecisionRule().changes_from(DecisionRule()) == []
    changed = DecisionRule(alpha=0.1, margins={"val_loss": 0.02}).changes_from(DecisionRule())
    assert changed == ["margins: none -> val_loss=0.02", "alpha: 0.05 -> 0.1"]
    bad = {
        "alpha": DecisionRule(alpha=1.5),
        "max_seeds": DecisionRule(max_seeds=2),
        "budget": DecisionRule(budget="lots"),
        "margins": DecisionRule(margins={"val_bpb": 0.01}),
        "metrics": DecisionRule(metrics=("accuracy",)),
    }
    for name, wrong in bad.items():
        with pytest.raises(ValueError, match=rf"^--margin: {name}"):
            wrong.check("--margin")
    with pytest.raises(ValueError, match="a number > 0"):
        DecisionRule(margins={"val_loss": -1}).check("f")


def test_parse_budget():
    assert parse_budget("") is None
    assert parse_budget("2e8") == ("tokens", 2e8) and parse_budget("500M") == ("tokens", 5e8)
    assert parse_budget("1.5B") == ("tokens", 1.5e9) and parse_budget("3h") == ("device_seconds", 10800)
    for wrong in ("3 hours", "-1", "0", "M"):
        with pytest.raises(ValueError):
            parse_budget(wrong)


# ---- contrasts from run folders --------------------------------------------------------------------------------


def three_variant_study(root: Path, seeds: dict[str, int], loser_shift: float = 1.0, unfinished: str = "") -> Path:
    """baseline, twin (the same model up to run noise) and slow (val loss `loser_shift` higher), each with its own
    number of paired seeds: a shared seed effect (sd 0.02) and run noise (sd 0.003). unfinished: a variant given
    one more, unfinished seed."""
    rng = np.random.default_rng(0)
    seed_fx, run_fx = rng.normal(0, 0.02, 10), rng.normal(0, 0.003, (3, 10))
    for k, (variant, shift) in enumerate((("baseline", 0.0), ("slow", loser_shift), ("twin", 0.0))):
        for seed in range(seeds[variant]):
            val = [4.0 - 0.2 * j + seed_fx[seed] + run_fx[k, seed] + shift for j in range(len(STEPS))]
            write_run(root, variant, seed, STEPS, val, {})
        if variant == unfinished:
            write_run(root, variant, seeds[variant], STEPS[:2], [4.0, 3.8], {}, finished=False)
    return root


def test_study_contrasts_decide_the_loser_at_three_seeds_and_no_winner_between_twins(tmp_path):
    root = three_variant_study(tmp_path / "exp", {"baseline": 6, "slow": 3, "twin": 6}, unfinished="slow")
    contrasts = folder_contrasts(root, DecisionRule(margins={"val_loss": 0.01}, max_seeds=6))
    by_pair = {(c.a, c.b): c for c in contrasts}
    assert set(by_pair) == {("baseline", "slow"), ("baseline", "twin"), ("slow", "twin")}
    slow = by_pair[("baseline", "slow")]
    assert (
        slow.decision == "a"
        and slow.seeds == 3
        and slow.decided_at == 3
        and slow.estimate == pytest.approx(-1, abs=0.01)
    )
    assert by_pair[("slow", "twin")].decision == "b"
    assert "slow: seed 3" in slow.note and "not paired" in slow.note  # the unfinished run is counted and said
    twins = by_pair[("baseline", "twin")]
    assert twins.decision in ("equivalent", "open") and twins.seeds == 6
    assert open_variants(contrasts) == ({"baseline", "twin"} if twins.decision == "open" else set())
    # the same pairs asked about two variants only: K = 1, a narrower interval
    (alone,) = folder_contrasts(root, DecisionRule(), ["baseline", "twin"])
    lo, hi = alone.interval
    assert alone.margin is None and alone.decision == "open" and hi - lo < twins.interval[1] - twins.interval[0]


def test_a_repeated_task_difference_stays_open_under_its_item_floor(tmp_path):
    """B = A plus the same 2 of 60 items right on each of 3 seeds: equal per-seed differences, which the item-noise
    floor (the discordant items) keeps from deciding; a metric the runs lack is open and says so."""
    root = tmp_path / "quiz"
    for seed in range(3):
        right = set(range(20 + seed))
        for variant, extra in (("A", set()), ("B", {50, 51})):
            items = {s: [{"id": f"q{i}", "acc_per_char": float(i in right | extra)} for i in range(60)] for s in STEPS}
            write_run(
                root,
                variant,
                seed,
                STEPS,
                [4.0, 3.8, 3.6, 3.5],
                {"quiz": {"chance": 0.25, "primary": "acc_per_char", "items": items}},
            )
    quiz, missing = folder_contrasts(root, DecisionRule(metrics=("quiz/acc_per_char", "other/acc")))
    assert quiz.estimate == pytest.approx(-2 / 60) and quiz.decision in ("open", "futile") and quiz.interval
    assert missing.decision == "open" and "no other/acc" in missing.note


def test_simulation_script_smoke():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke"], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    assert "| A/A |" in out and "| C worse by 10 sd |" in out and "largest any-wrong-decision share" in out


ALPHA_2SE_200 = 0.05 + 2 * math.sqrt(0.05 * 0.95 / 200)


@pytest.mark.slow  # simulates at length: the whole suite runs it, not the quick tier
def test_accuracy_aa_studies_claim_at_most_alpha():
    """200 A/A studies on 200 0/1 items (shared difficulties, seed and item noise, and each variant's persistent
    item quirks, sd 1.5 logits), each prefix under stats.paired_noise of its per-item differences: the share with
    any wrong decision stays <= alpha + 2 se."""
    quirky = sim_studies.simulate_accuracy("A/A", 0.0, 200, 0.05, np.random.default_rng(3), quirk_sd=1.5)
    assert quirky["wrong_any"] <= ALPHA_2SE_200 and quirky["item_sd"] > 0.01
    result = sim_studies.simulate_accuracy("A/A", 0.0, 200, 0.05, np.random.default_rng(3))
    assert result["wrong_any"] <= ALPHA_2SE_200
    assert result["floor_sd"] == pytest.approx(result["sd_diff"], rel=0.2)  # item noise is most of the spread


def test_identical_item_differences_are_not_a_winner_under_the_floor():
    """C = A plus the same 3 of 200 items right on every seed: equal per-seed differences (no seed spread). With the
    floor, A vs C gets an interval and stays open; the study is decided wrong in <= alpha + 2 se of 200 studies.
    Without it, A vs C has no interval at all (open: undecidable)."""
    result = sim_studies.simulate_accuracy("C = A + 3", 0.0, 200, 0.05, np.random.default_rng(4), copied=3)
    assert result["wrong_any"] <= ALPHA_2SE_200 and result["no_interval"] == 0
    assert result["planted"] == pytest.approx(3 / 200) and result["sd_diff"] == 0
    study = sim_studies.run_accuracy_study(np.random.default_rng(5), 0.0, 0.05, copied=3)
    (a_c,) = [c for c in study["contrasts"] if (c.a, c.b) == ("A", "C")]
    assert a_c.decision == "open" and a_c.interval is not None and a_c.estimate == pytest.approx(-3 / 200)
    bare = sim_studies.run_accuracy_study(np.random.default_rng(5), 0.0, 0.05, copied=3, floor=False)
    (a_c,) = [c for c in bare["contrasts"] if (c.a, c.b) == ("A", "C")]
    assert a_c.decision == "open" and a_c.interval is None and a_c.seeds == sim_studies.MAX_SEEDS


def test_a_16_point_accuracy_gap_is_decided_within_8_seeds():
    """C better by 1 logit (16 points on 200 items). The former floor counted each seed's fresh answer noise as if
    it persisted and never decided it (t at most 3.85 against t* 5.89); under the noise model (fresh noise divided
    by the seeds, the persistent item part not) it is decided for C, never for A, in most studies by 8 seeds."""
    result = sim_studies.simulate_accuracy("1 logit", 1.0, 100, 0.05, np.random.default_rng(8))
    assert result["planted"] == pytest.approx(0.16, abs=0.01)
    assert result["wrong"] == 0 and result["right"] > 0.9 and result["seeds_at_decision"] < 7.5


@pytest.mark.slow  # simulates at length: the whole suite runs it, not the quick tier
def test_a_large_planted_accuracy_effect_is_decided_the_right_way():
    """C better by 2 logits (about 28 accuracy points on 200 items): decided for C in most studies, never for A."""
    result = sim_studies.simulate_accuracy("2 logits", 2.0, 200, 0.05, np.random.default_rng(6))
    assert result["planted"] == pytest.approx(0.28, abs=0.03)
    assert result["wrong"] == 0 and result["right"] > 0.8  # 1.00 over 1000 studies (docs/reports.md)


def test_simulation_script_accuracy_mode():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--accuracy", "--studies", "5"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert "| A/A |" in out.stdout and "| C = A + 3 of 200 items, no noise model |" in out.stdout
    assert "| A/A, item quirks sd 1.5 |" in out.stdout
