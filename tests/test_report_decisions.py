"""Decisions that compare like with like, in the fixed report and the adaptive study alike (issue 33): the leader
from paired estimates, token counts checked by one rule on both paths, failed seeds never a win, and sequential
prefixes in the order the study trained its seeds."""

import json

import numpy as np
import pytest

from ablate.report import Options, write_report
from ablate.report.schema import Criteria, Pairwise, Quality, Series, SeriesRun
from ablate.report.schema.signal import TracksTask
from ablate.report.sections.sequential.contrasts import trained_order
from ablate.report.sections.sequential.rule import STUDY_FILE, DecisionRule
from ablate.report.sections.sequential.section import folder_contrasts
from report_fixtures import STEPS, record_with, write_run

FAST = Options(bootstrap=0)


def _val(final: float) -> list[float]:
    """A validation curve ending at `final` (the run's score)."""
    return [final + 0.3, final + 0.2, final + 0.1, final]


def _val_series(report: dict) -> dict:
    return next(s for s in report["groups"][0]["series"] if s["task"] == "val_loss")


def _decision(report: dict) -> dict:
    return next(d for d in report["headline"]["decisions"] if d["task"] == "val_loss")


def _write_study(root, rounds: list[dict[str, list[int]]]) -> dict:
    rule = DecisionRule()
    study = {
        "rule": rule.to_dict(),
        "rule_history": [{"rule": rule.to_dict(), "set_after_results": False, "round": 1}],
        "rounds": [{"round": i + 1, "seeds": seeds, "tokens": 0} for i, seeds in enumerate(rounds)],
        "stopped": "max_seeds",
    }
    (root / STUDY_FILE).write_text(json.dumps(study))
    return study


# ---- the leader ----------------------------------------------------------------------------------------------


def test_the_leader_comes_from_paired_estimates_on_shared_seeds(tmp_path):
    """Issue 33's case: A on seeds 0-4 has the lowest mean (its seeds 3 and 4 are lucky), but B, run on seeds 0-2
    only (an adaptive study stopped giving it seeds), beats A and C on every seed both ran. B is named ahead of A
    and C; no significant pair is called "not separated"."""
    root = tmp_path / "unequal"
    finals = {
        "A": [3.00, 3.01, 3.02, 2.70, 2.71],
        "B": [2.95, 2.965, 2.97],
        "C": [3.10, 3.105, 3.098, 3.102, 3.11],
    }
    for variant, values in finals.items():
        for seed, value in enumerate(values):
            write_run(root, variant, seed, STEPS, _val(value), {})
    report = write_report(root, opts=FAST)
    series, decision = _val_series(report), _decision(report)
    assert np.mean(finals["A"]) < np.mean(finals["B"])  # the unpaired means would have named A
    assert series["best"] == "B"
    assert decision["leader"] == "B" and decision["status"] == "best", decision["text"]
    assert sorted(decision["ahead_of"]) == ["A", "C"] and decision["not_separated_from"] == []
    assert "B best, ahead of A, C" in decision["text"]
    for p in series["pairwise"]:
        if p["significant"]:
            assert not {p["a"], p["b"]} <= {decision["leader"], *decision["not_separated_from"]}


# ---- token counts: one rule, both paths ----------------------------------------------------------------------


def _drop_tokens(run) -> None:
    """The run's metrics.jsonl without token counts (a run from before they were logged)."""
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "tokens"}) + "\n" for r in rows))


def test_a_missing_token_count_refuses_the_pair_in_the_report_and_the_study(tmp_path):
    """A at 1M tokens on 3 seeds; B at 0.5M on two seeds and no count on the third, far behind: once the check was
    switched off by the missing count (p = 0.00027). Now not tested, and not decided, with the reason."""
    root = tmp_path / "missing"
    for seed in range(3):
        write_run(root, "A", seed, STEPS, _val(3.0 + 0.01 * seed), {}, tokens_per_step=25_000)
        run = write_run(root, "B", seed, STEPS, _val(3.5 + 0.012 * seed), {}, tokens_per_step=12_500)
        if seed == 2:
            _drop_tokens(run)
    report = write_report(root, opts=FAST)
    (pair,) = _val_series(report)["pairwise"]
    assert not pair["testable"] and pair["untested"] == "tokens" and pair["significant"] is None
    assert "token count not logged for 1 of 6 compared runs" in pair["note"]
    (contrast,) = folder_contrasts(root, DecisionRule())
    assert contrast.decision == "open" and "token count not logged for 1 of 6" in contrast.note


def test_points_far_apart_in_tokens_are_refused_by_the_report_and_the_study(tmp_path):
    """A ends at 1.0M tokens; B is evaluated only at 0.6M and 1.2M, so it is read at 0.6M, 40% apart. The study
    once decided 'A better' at 3 seeds there; both paths now refuse it, through match.token_gap."""
    root = tmp_path / "gap"
    for seed in range(3):
        write_run(root, "A", seed, STEPS, _val(3.0 + 0.01 * seed), {}, tokens_per_step=25_000)
        write_run(root, "B", seed, [15, 30], [3.4 + 0.01 * seed, 2.9 + 0.01 * seed], {}, tokens_per_step=40_000)
    report = write_report(root, opts=FAST)
    (pair,) = _val_series(report)["pairwise"]
    assert not pair["testable"] and pair["token_gap"] == pytest.approx(0.4)
    assert "600,000 to 1,000,000 tokens, 40% apart (> 5%" in pair["note"]
    (contrast,) = folder_contrasts(root, DecisionRule())
    assert contrast.decision == "open" and "40% apart (> 5%" in contrast.note
    (loose,) = folder_contrasts(root, DecisionRule(), max_token_gap=0.5)
    assert loose.decision == "a"  # what the gap check stops: A's lead at equal steps, not at equal tokens
    _write_study(root, [{"A": [0, 1, 2], "B": [0, 1, 2]}])
    section = write_report(root, tmp_path / "out", FAST)["sequential"]
    assert section["contrasts"][0]["decision"] == "open" and "40% apart" in section["contrasts"][0]["note"]


# ---- failures --------------------------------------------------------------------------------------------------


def _aa_with_worst_quarter_diverged(root, rng) -> None:
    """A/A over 8 seeds (independent run noise, sd 0.02); A's worst 2 seeds diverge (status.json, no summary)."""
    values = {v: 3.0 + rng.normal(0, 0.02, 8) for v in ("A", "B")}
    worst = set(np.argsort(values["A"])[-2:].tolist())
    for variant, finals in values.items():
        for seed, value in enumerate(finals):
            diverged = variant == "A" and seed in worst
            run = write_run(root, variant, seed, STEPS, _val(value), {}, finished=not diverged)
            if diverged:
                (run / "status.json").write_text(json.dumps({"state": "diverged", "message": "loss spike", "step": 40}))


def test_a_variant_diverging_on_its_worst_seeds_is_never_decided_better(tmp_path):
    """The fixed report's rule in the adaptive study: A's survivors look better than B, but A is never decided
    better (nor equivalent), and the contrast says '2 of 8 seeds diverged'. The interval itself is kept: in some
    of these studies it excludes 0 on A's side, a decision the rule stops."""
    rng = np.random.default_rng(7)
    on_a_side = 0
    for k in range(6):
        root = tmp_path / f"aa{k}"
        _aa_with_worst_quarter_diverged(root, rng)
        (c,) = folder_contrasts(root, DecisionRule())
        assert c.decision != "a" and c.seeds == 6
        assert "A: 2 of 8 seeds diverged (never decided better or equivalent)" in c.note
        on_a_side += c.interval[1] < 0  # lower is better: a - b below 0 everywhere
        (wide,) = folder_contrasts(root, DecisionRule(margins={"val_loss": 0.1}))
        assert wide.decision == "open" and wide.interval[0] > -0.1 and wide.interval[1] < 0.1  # never equivalent
    assert on_a_side >= 1


# ---- sequential prefixes in the order seeds were trained -------------------------------------------------------


def _study_in_order(root, seed_numbers: list[int]) -> dict:
    """Two variants trained in rounds of 3, 1, 1, 1 seeds, the k-th seed trained holding the k-th value whatever
    its number: a clear difference on the first three, noise after."""
    diffs = [0.30, 0.31, 0.305, 0.2, 0.45, 0.1]
    base = 3.0 + np.random.default_rng(3).normal(0, 0.02, 6)
    for k, seed in enumerate(seed_numbers):
        for variant, final in (("A", base[k]), ("B", base[k] + diffs[k])):
            # per-sequence losses keyed by the trained position, not the seed number: the same data either way
            quirks = np.random.default_rng([k, variant == "A"]).permutation(np.linspace(-0.002, 0.002, 20))
            items = {step: list(value + quirks) for step, value in zip(STEPS, _val(final))}
            write_run(root, variant, seed, STEPS, _val(final), {}, val_items=items)
    rounds = [seed_numbers[:3], *([s] for s in seed_numbers[3:])]
    return _write_study(root, [{"A": seeds, "B": seeds} for seeds in rounds])


def test_shuffled_seed_numbers_give_the_same_sequential_decisions(tmp_path):
    """A file with seeds 5, 6, 7 gets seed 0 next: the prefixes follow the study's rounds, so its decisions,
    intervals and decision points are those of the same values trained as seeds 0-5."""
    plain = tmp_path / "plain"
    shuffled = tmp_path / "shuffled"
    study_plain = _study_in_order(plain, [0, 1, 2, 3, 4, 5])
    study_shuffled = _study_in_order(shuffled, [5, 6, 7, 0, 1, 2])
    (want,) = folder_contrasts(plain, DecisionRule(), trained=trained_order(study_plain))
    (got,) = folder_contrasts(shuffled, DecisionRule(), trained=trained_order(study_shuffled))
    assert want.decision == "a" and want.decided_at == 3
    assert (got.decision, got.decided_at, got.seeds) == (want.decision, want.decided_at, want.seeds)
    assert got.interval == pytest.approx(want.interval)
    (by_number,) = folder_contrasts(shuffled, DecisionRule())  # ordered by seed number: another sequence
    assert by_number.interval != pytest.approx(want.interval)
    report = write_report(shuffled, opts=FAST)  # the report reads the order from study.json
    assert report["sequential"]["contrasts"][0]["interval"] == pytest.approx(list(want.interval))


# ---- the tracking gate ranks variants, not training progress ---------------------------------------------------


def _series(metric: str, by_variant: dict[str, list[float]], direction: str = "higher") -> Series:
    """A series as analyze builds it (the fields tracking reads): 2 seeds per variant, 4 checkpoints."""
    runs = {
        f"{v}/seed{seed}": SeriesRun(
            variant=v, seed=seed, steps=STEPS, tokens=[], values=[x + 0.001 * seed for x in values], stderr=[]
        )
        for v, values in by_variant.items()
        for seed in range(2)
    }
    return record_with(
        Series,
        metric=metric,
        direction=direction,
        runs=runs,
        baseline=False,
        primary=True,
        quality=_quality(above_chance=True),
    )


def _quality(above_chance: bool) -> Quality:
    """A series' quality with only the criterion tracking reads (whether its accuracy is past chance)."""
    return record_with(Quality, criteria=Criteria(monotone=None, consistent=None, above_chance=above_chance))


def test_the_tracking_gate_refuses_a_metric_that_ranks_variants_against_the_task():
    """correct_prob rises with training as the accuracy does (pooled over (run, checkpoint) points their rank
    correlation is high), but orders A, B, C exactly against it (Kendall -1): refused. One swap among three (tau
    1/3) is refused too; the accuracy's own order passes."""
    from ablate.report.stats import describe
    from ablate.report.sections.signal import tracking

    rank = {"A": 2, "B": 1, "C": 0}
    accuracy = _series("acc", {v: [0.3 + 0.1 * k + 0.02 * r for k in range(4)] for v, r in rank.items()})
    opposite = _series("correct_prob", {v: [0.1 + 0.1 * k + 0.02 * (2 - r) for k in range(4)] for v, r in rank.items()})
    pooled = describe.spearman(
        [x for r in opposite.runs.values() for x in r.values],
        [x for r in accuracy.runs.values() for x in r.values],
    )
    assert pooled > 0.5  # what the old gate measured, and passed
    refused = tracking.from_runs("t", opposite, [accuracy], None)
    assert not refused.passes and refused.evidence.value == -1
    assert refused.why == "does not rank the variants as t's accuracy does (tau -1 < 0.5)"
    swap = {"A": 2, "B": 0, "C": 1}
    one_swap = _series("correct_prob", {v: [0.1 + 0.1 * k + 0.02 * r for k in range(4)] for v, r in swap.items()})
    assert tracking.from_runs("t", one_swap, [accuracy], None).evidence.value == pytest.approx(1 / 3)
    assert not tracking.from_runs("t", one_swap, [accuracy], None).passes
    same = _series("correct_prob", {v: [0.1 + 0.1 * k + 0.02 * r for k in range(4)] for v, r in rank.items()})
    assert tracking.from_runs("t", same, [accuracy], None) == tracking.Tracking(
        TracksTask(against="acc", value=1, passes=True, weaker=None), why=None
    )


# ---- the fallback's carry-forward ------------------------------------------------------------------------------


def test_a_primary_family_that_tested_nothing_carries_nothing_forward():
    """0 of 0 primary pairs rejected is not 'every pair it tested': the task family keeps alpha x (1 - share)."""
    from ablate.report.sections.decisions import families

    def series(task: str, testable: bool) -> dict:
        row = {"a": "A", "b": "B", "testable": testable, "p_seeds": 0.001 if testable else None, "significant": None}
        row |= {"diff": 0.1, "sd_diff": 0.05, "sd_seeds": 0.05, "df": 2, "paired": True, "noise_floor_sd": None}
        row |= {"item_sd": None, "item_df": None, "n_seeds": 3, "untested": None if testable else "no_spread"}
        metric = "loss" if task == "val_loss" else "acc"
        return record_with(Series, task=task, metric=metric, primary=True, pairwise=[record_with(Pairwise, **row)])

    primary, task = series("val_loss", testable=False), series("quiz:cf", testable=True)
    out, _ = families.apply_family([primary, task], FAST, "(one scale)")
    first, second = out.families
    assert first.tests == 0 and second.alpha == pytest.approx(0.01) and not second.carried_forward
    assert "rejected every pair it tested" not in out.family
    primary = series("val_loss", testable=True)  # tested and rejected: now it carries
    carried, _ = families.apply_family([primary, series("quiz:cf", testable=True)], FAST, "(one scale)")
    assert carried.families[1].alpha == pytest.approx(0.05) and "its alpha carried forward" in carried.family


# ---- bits per byte across tokenizers: only on the same text ----------------------------------------------------


def _tokenizer_runs(root, texts: dict[str, str | None]) -> None:
    """Two tokenizers x 5 seeds logging val/bpb, B's 0.01 bpb above A's (seed sd 0.003): what a text offset gives,
    repeated on every seed. texts: variant -> the sha256 of the validation text its runs scored (None: not recorded)."""
    rng = np.random.default_rng(11)
    for variant, offset in (("A", 0.0), ("B", 0.01)):
        for seed in range(5):
            bpb = 1.2 + offset + rng.normal(0, 0.003)
            run = write_run(root, variant, seed, STEPS, _val(3.0 + offset), {})
            path = run / "metrics.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            for row in rows:
                if "val/loss" in row:
                    row["val/bpb"] = bpb + 0.1 * (STEPS[-1] - row["step"]) / 10
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            summary = json.loads((run / "summary.json").read_text())
            summary["tokenizer"] = {"sha256": f"tokenizer-{variant}"}
            if texts[variant]:
                summary["val_scored"] = {"tokens": 2048, "bytes": 8000, "text_sha256": texts[variant]}
            (run / "summary.json").write_text(json.dumps(summary))


@pytest.mark.parametrize(
    "texts, why",
    [
        ({"A": "text-1", "B": "text-2"}, "the runs scored 2 different validation texts"),
        ({"A": "text-1", "B": None}, "which 5 of 10 runs do not record"),
    ],
)
def test_bits_per_byte_of_different_text_are_refused(tmp_path, texts, why):
    """A 0.01 bpb offset at seed sd 0.003 over 5 seeds was p = 0.005 when each tokenizer scored its own text; where
    the runs' texts differ, or are not recorded, validation is left out of the comparison, with the reason, and an
    adaptive study does not decide on it."""
    root = tmp_path / "bpb"
    _tokenizer_runs(root, texts)
    report = write_report(root, opts=FAST)
    assert report["tokenizers"]["differ"] and report["tokenizers"]["compared_by"] is None
    assert not [s for s in report["groups"][0]["series"] if s["task"] == "val_loss"]
    assert why in report["headline"]["text"] and "validation is left out" in report["headline"]["text"]
    (contrast,) = folder_contrasts(root, DecisionRule())
    assert contrast.metric == "val_bpb" and contrast.decision == "open" and why in contrast.note


def test_bits_per_byte_of_the_same_text_are_compared(tmp_path):
    root = tmp_path / "bpb"
    _tokenizer_runs(root, {"A": "text-1", "B": "text-1"})
    report = write_report(root, opts=FAST)
    assert report["tokenizers"]["compared_by"] == "bpb" and "same validation text" in report["tokenizers"]["text"]
    (val,) = [s for s in report["groups"][0]["series"] if s["task"] == "val_loss"]
    assert val["metric"] == "bpb" and val["pairwise"][0]["diff"] == pytest.approx(-0.01, abs=0.005)
    (contrast,) = folder_contrasts(root, DecisionRule())
    assert contrast.metric == "val_bpb" and "not decided" not in contrast.note


def test_runs_of_two_validation_definitions_never_compare_on_validation(tmp_path):
    """Runs trained before validation scored whole documents (no val_scored.documents) scored other text, with
    other item ids: mixed with newer runs, validation is left out of the report and the study does not decide on
    it, saying why; all of one kind compare as usual."""
    root = tmp_path / "mixed"
    for seed in range(3):
        for variant, final in (("A", 3.0), ("B", 3.3)):
            run = write_run(root, variant, seed, STEPS, _val(final + 0.01 * seed), {})
            if variant == "A":  # A retrained after the change, B not
                summary = json.loads((run / "summary.json").read_text())
                summary["val_scored"] = {"documents": 40, "tokens": 2048, "bytes": 8000, "text_sha256": "t"}
                (run / "summary.json").write_text(json.dumps(summary))
    report = write_report(root, opts=FAST)
    assert not [s for s in report["groups"][0]["series"] if s["task"] == "val_loss"]
    assert "3 of 6 runs scored validation sequences" in report["tokenizers"]["text"]
    assert "Validation is left out of the comparison" in report["headline"]["text"]
    (c,) = folder_contrasts(root, DecisionRule())
    assert c.decision == "open" and "3 of 6 runs scored validation sequences" in c.note
    for seed in range(3):  # B retrained too: one definition, validation compared again
        summary_path = root / "B" / f"seed{seed}" / "summary.json"
        summary = json.loads(summary_path.read_text())
        summary["val_scored"] = {"documents": 40, "tokens": 2048, "bytes": 8000, "text_sha256": "t"}
        summary_path.write_text(json.dumps(summary))
    assert [s for s in write_report(root, opts=FAST)["groups"][0]["series"] if s["task"] == "val_loss"]
