"""`ablate report` on an adaptive study (a folder with study.json): the `sequential` section recomputed from the run
folders, the headline in words, the fixed-n p-values labelled, a rule changed after results flagged."""

import json

import pytest

from ablate import rundir
from ablate.report import Options, ReportError, write_report
from ablate.report.sections.sequential.rule import STUDY_FILE, DecisionRule
from test_sequential import three_variant_study

FAST = Options(bootstrap=0)
FIELDS = {"a", "b", "metric", "decision", "seeds", "interval", "estimate", "margin"}


def _write_study(
    root, rule: DecisionRule, seeds: dict[str, int], changed_after: bool = False, extra=None, first=None
) -> None:
    """study.json as the driver writes it: round 1 with 3 seeds of each variant, then one seed per round for the
    variants that have more. first: the rule recorded before round 1 (default: DecisionRule() of the same design)."""
    rounds = [{"round": 1, "seeds": {v: [0, 1, 2] for v in seeds}, "tokens": 0, "wall_seconds": 1.0}]
    for k in range(3, max(seeds.values())):
        rounds.append({"round": k - 1, "seeds": {v: [k] for v, n in seeds.items() if n > k}, "tokens": 0})
    first = first or DecisionRule(design=rule.design)
    history = [{"rule": first.to_dict(), "set_after_results": False, "round": 0}]
    if changed_after:
        history.append({"rule": rule.to_dict(), "set_after_results": True, "round": 2})
    study = {"rule": rule.to_dict(), "rule_history": history, "rounds": rounds, "stopped": "max_seeds"}
    (root / STUDY_FILE).write_text(json.dumps(study | (extra or {})))


@pytest.fixture
def study(tmp_path):
    seeds = {"baseline": 6, "slow": 3, "twin": 6}
    root = three_variant_study(tmp_path / "exp", seeds)
    _write_study(root, DecisionRule(margins={"val_loss": 0.01}, max_seeds=6), seeds)
    return root


def test_the_sequential_section_holds_every_contrast_and_the_compute(study):
    assert STUDY_FILE == rundir.STUDY
    report = write_report(study, opts=FAST)
    seq = report["sequential"]
    assert [(c["a"], c["b"]) for c in seq["contrasts"]] == [
        ("baseline", "slow"),
        ("baseline", "twin"),
        ("slow", "twin"),
    ]
    assert all(FIELDS <= set(c) for c in seq["contrasts"])
    slow = seq["contrasts"][0]
    assert slow["decision"] == "a" and slow["seeds"] == 3 and slow["decided_at"] == 3
    assert seq["contrasts"][1]["decision"] in ("equivalent", "open")  # the twins: never a winner
    compute = seq["compute"]
    # 15 runs of 4,000 tokens each, against 6 seeds x 3 variants
    assert compute["tokens"] == 15 * 4000 and compute["fixed_design_share"] == pytest.approx(15 / 18)
    assert compute["device_seconds"] == pytest.approx(15 * 12.5)
    assert report["inference"]["valid_under_optional_stopping"] is False
    assert not seq["rule_changed_after_results"]


def test_the_headline_says_the_study_in_words_and_labels_the_fixed_tests(study):
    report = write_report(study, opts=FAST)
    text = report["headline"]["text"]
    assert text.startswith("exp (adaptive study): slow worse than baseline, decided at 3 seeds; ")
    assert "83% of a fixed 6-seed design's compute" in text and "stopped at max seeds" in text
    assert "Fixed-n tests (p-values not valid under optional stopping): val_loss:" in text
    assert "FLAGGED" not in text
    md, html = (study / "report.md").read_text(), (study / "report.html").read_text()
    for page in (md, html):
        assert "Adaptive study" in page and "repeated interval" in page and "baseline better" in page
        assert "not valid under optional stopping" in page


def test_a_rule_changed_after_results_is_flagged(tmp_path):
    seeds = {"baseline": 4, "slow": 3, "twin": 4}
    root = three_variant_study(tmp_path / "exp", seeds)
    _write_study(root, DecisionRule(alpha=0.1, max_seeds=4), seeds, changed_after=True)
    report = write_report(root, opts=FAST)
    assert report["sequential"]["rule_changed_after_results"]
    assert report["sequential"]["rule_changes"] == ["after round 2: alpha: 0.05 -> 0.1; max_seeds: 8 -> 4"]
    assert "FLAGGED: the decision rule changed after results were seen" in report["headline"]["text"]
    assert "FLAGGED" in (root / "report.md").read_text()


def test_raising_max_seeds_after_results_keeps_the_anytime_guarantee_only(tmp_path):
    """Ville's inequality holds at any stopping time: more seeds for the anytime design is no change of its rule
    (listed as a stopping change, never FLAGGED); the group-sequential design fixed its looks against max_seeds, so
    there the same change is FLAGGED (the driver refuses it: tests/test_study.py)."""
    from ablate.report.sections.sequential.rule import voids_guarantee

    seeds = {"baseline": 4, "slow": 3, "twin": 4}
    root = three_variant_study(tmp_path / "exp", seeds)
    _write_study(root, DecisionRule(max_seeds=12, design="anytime"), seeds, changed_after=True)
    report = write_report(root, opts=FAST)
    seq = report["sequential"]
    assert not seq["rule_changed_after_results"] and seq["rule_changes"] == []
    assert seq["stopping_changes"] == ["after round 2: max_seeds: 8 -> 12"]
    assert "FLAGGED" not in report["headline"]["text"]
    _write_study(root, DecisionRule(max_seeds=12), seeds, changed_after=True)
    flagged = write_report(root, opts=FAST)["sequential"]
    assert flagged["rule_changed_after_results"] and flagged["rule_changes"] == ["after round 2: max_seeds: 8 -> 12"]
    assert voids_guarantee({"max_seeds"}, "group_sequential") and voids_guarantee({"max_seeds", "alpha"})
    assert voids_guarantee(None) and not voids_guarantee({"max_seeds"}, "anytime")
    assert not voids_guarantee({"budget", "futility"}, "group_sequential")


def test_the_report_recomputes_rather_than_trusting_study_json(tmp_path):
    seeds = {"baseline": 3, "slow": 3, "twin": 3}
    root = three_variant_study(tmp_path / "exp", seeds)
    wrong = [{"a": "baseline", "b": "slow", "metric": "val_loss", "decision": "b"}]
    _write_study(root, DecisionRule(), seeds, extra={"contrasts": wrong})
    report = write_report(root, opts=FAST)
    assert report["sequential"]["contrasts"][0]["decision"] == "a"


def test_no_study_no_section_and_a_damaged_record_is_named(tmp_path):
    root = three_variant_study(tmp_path / "exp", {"baseline": 3, "slow": 3, "twin": 3})
    report = write_report(root, opts=FAST)
    assert report["sequential"] is None and "valid_under_optional_stopping" not in report["inference"]
    assert "adaptive" not in report["headline"]["text"] and "Adaptive study" not in (root / "report.md").read_text()
    (root / STUDY_FILE).write_text("{not json")
    with pytest.raises(ReportError, match="study.json: not a study record"):
        write_report(root, opts=FAST)


def _contrast(a, b, decision, seeds=8, **more):
    from ablate.report.schema import Contrast

    fields = dict(interval=[-0.1, 0.1], estimate=0.0, margin=0.01, decided_at=3, note="", boundary=None, looks=[])
    fields |= dict(level=None, chance=None, fixed_power=None) | more
    return Contrast(a=a, b=b, metric="val_loss", decision=decision, seeds=seeds, **fields)


def _study_record(contrasts, stopped: str, fixed_design_share: float | None, futility: float = 0.0):
    """An adaptive study's record (schema.Sequential) around the given contrasts, the rest plain defaults."""
    from ablate.report.schema import Rule, Sequential
    from ablate.report.schema.sequential import StudyCompute

    rule = Rule(**{**DecisionRule().to_dict(), "futility": futility})
    compute = StudyCompute(
        tokens=0, device_seconds=None, fixed_design_seeds=8, fixed_design_tokens=0,
        fixed_design_share=fixed_design_share, fixed_design_share_time=None,
    )  # fmt: skip
    return Sequential(
        design="anytime", method="", rule=rule, rule_history=[], rule_changed_after_results=False, rule_changes=[],
        stopping_changes=[], alpha=0.05, alpha_per_contrast=0.05, rounds=1, stopped=stopped, contrasts=contrasts,
        open=[], compute=compute,
    )  # fmt: skip


def test_many_open_contrasts_are_one_clause_of_the_headline():
    from ablate.report.sections.sequential.headline import sequential_text

    opened = [_contrast(f"v{i}", f"w{i}", "open") for i in range(5)]
    section = _study_record([_contrast("slow", "base", "b"), *opened], "max_seeds", 0.9)
    text = sequential_text(section)
    assert "slow worse than base, decided at 3 seeds" in text
    assert "5 of 6 contrasts open at 8 seeds (see the table)" in text and "v0 vs w0" not in text


def test_a_contrast_closed_for_futility_says_so_with_its_chance_and_the_fixed_designs_power(tmp_path):
    """Twins at 3 seeds of 8, no margin: the chance of a decision by 8 is small, so the contrast is closed for
    futility; report.json records its chance and the fixed 8-seed design's power at the difference seen, and the
    words are the rule's ("closed for futility (estimated chance of a decision < 0.1)"), never "undecidable". The two
    losers, decided on a side, pass their alpha on (Holm): the twins are judged at alpha / 1."""
    seeds = {"baseline": 3, "slow": 3, "twin": 3}
    root = three_variant_study(tmp_path / "exp", seeds)
    _write_study(root, DecisionRule(), seeds)
    report = write_report(root, opts=FAST)
    twins = report["sequential"]["contrasts"][1]
    assert (twins["a"], twins["b"], twins["decision"]) == ("baseline", "twin", "futile")
    assert 0 <= twins["chance"] < 0.1 and 0 < twins["fixed_power"] < 1 and twins["level"] == pytest.approx(0.05)
    assert [c["level"] for c in report["sequential"]["contrasts"]] == pytest.approx([0.05 / 3, 0.05, 0.05 / 3])
    words = "closed for futility (estimated chance of a decision < 0.1)"
    assert f"baseline vs twin {words} at 3 seeds" in report["headline"]["text"]
    md, html = (root / "report.md").read_text(), (root / "report.html").read_text()
    assert f"{words}: estimated chance {twins['chance']:.2f}; a fixed 8-seed design's power" in md
    assert words in html.replace("&lt;", "<")
    for page in (report["headline"]["text"], md, html):
        assert "undecidable" not in page.lower()


def test_a_study_record_that_says_undecidable_still_reads_as_closed_for_futility():
    """study.json files written before the word changed hold "undecidable": the console, ablate status and the
    headline read it as the same decision."""
    from ablate.report.sections.sequential.headline import sequential_text
    from ablate.report.sections.sequential.words import contrast_line

    old = {"a": "x", "b": "y", "metric": "val_loss", "decision": "undecidable", "seeds": 3, "interval": [-1, 1]}
    line = contrast_line(old, 0.1)
    assert "x vs y: closed for futility (estimated chance of a decision < 0.1)  (3 seeds" in line
    closed = _contrast("x", "y", "undecidable", seeds=3, interval=[-1, 1], decided_at=None, margin=None)
    section = _study_record([closed], "decided", None, futility=0.1)
    assert "x vs y closed for futility (estimated chance of a decision < 0.1) at 3 seeds" in sequential_text(section)
