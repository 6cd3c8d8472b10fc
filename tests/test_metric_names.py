"""Metric names that match the field: DataDecide's MARGIN is `margin`, ablate's log-likelihood gap `margin_loglik`,
and run folders written before the rename (their "margin" was the log-likelihood gap) load under today's names."""

import math

import pytest
from report_fixtures import write_run

from ablate.eval.metrics import ANSWER_BLIND, CONTINUOUS, ItemScores, item_metrics
from ablate.eval.suite import metrics_for
from ablate.eval.tasks import Task
from ablate.report.inputs.runs import load_runs, task_infos

STEPS = [10, 20]


def three_choices(gold: int) -> ItemScores:
    # per-character log-likelihoods: -3/3 = -1, -8/4 = -2, -5/10 = -0.5
    return ItemScores(
        logprobs=[-3.0, -8.0, -5.0], unconditional=[], tokens=[1, 2, 3], chars=[3, 4, 10], bytes=[3, 4, 10], gold=gold
    )


def test_margin_is_datadecides_per_character_probability_gap():
    names = ("margin", "margin_loglik")
    first = item_metrics(three_choices(gold=0), names=names)
    # p = exp(per char): e^-1 for the gold, the best wrong one e^-0.5
    assert first["margin"] == pytest.approx(math.exp(-1) - math.exp(-0.5))
    assert first["margin_loglik"] == pytest.approx(-3 - (-8 - 5) / 2)  # gold minus the wrong choices' mean
    last = item_metrics(three_choices(gold=2), names=names)
    assert last["margin"] == pytest.approx(math.exp(-0.5) - math.exp(-1)) and last["margin"] > 0
    assert last["margin_loglik"] == pytest.approx(-5 - (-3 - 8) / 2)
    alone = ItemScores(logprobs=[-2.0], unconditional=[], tokens=[1], chars=[2], bytes=[2], gold=0)
    assert item_metrics(alone, names=names) == {"margin": 0.0, "margin_loglik": 0.0}  # no wrong choice


def test_margin_is_always_computed_beside_margin_loglik():
    """What tells a new evals.jsonl line or item row from an old one: "margin" never comes without "margin_loglik"."""

    def build(row, index):
        raise AssertionError("never built")

    task = Task(name="t", data="x", build=build, primary="acc_raw")
    assert metrics_for(task, "cf", ("margin",)) == ("acc_raw", "margin_loglik", "margin")
    assert metrics_for(task, "cf", ("margin_loglik",)) == ("acc_raw", "margin_loglik")


def test_answer_blind_metrics_are_continuous_and_ignore_the_gold():
    assert set(ANSWER_BLIND) <= set(CONTINUOUS)
    for name in ANSWER_BLIND:
        values = {item_metrics(three_choices(g), names=(name,))[name] for g in range(3)}
        assert len(values) == 1, name


def old_items(shift: float) -> list[dict]:
    """Per-item rows as ablate wrote them before DataDecide's margin: "margin" was the log-likelihood gap."""
    return [
        {"id": i, "gold": 0, "group": "ab"[i % 2], "acc_per_char": float(i % 3 == 0), "margin": shift + 0.1 * i}
        for i in range(6)
    ]


def test_old_run_folders_load_margin_as_margin_loglik(tmp_path):
    root = tmp_path / "exp"
    for variant, shift in (("A", 1.0), ("B", 2.0)):
        items = {step: old_items(shift + step / 10) for step in STEPS}
        write_run(
            root, variant, 0, STEPS, [4.0, 3.5], {"toy": {"chance": 0.25, "primary": "acc_per_char", "items": items}}
        )
    runs, skipped = load_runs(root)
    assert not skipped and len(runs) == 2
    info = task_infos(runs)["toy:cf"]
    assert "margin_loglik" in info.metrics and "margin" not in info.metrics
    for run in runs:
        assert {m for task, m in run.scores if task == "toy:cf"} == {"acc_per_char", "margin_loglik"}
        points = run.scores[("toy:cf", "margin_loglik")]
        assert [p.step for p in points] == STEPS and all(p.stderr is not None for p in points)
        assert set(run.group_scores[("toy:cf", "margin_loglik")]) == {"a", "b"}
        assert ("toy:cf", "margin") not in run.group_scores
        rows = run.items(info, STEPS[-1])
        assert all("margin_loglik" in row and "margin" not in row for row in rows.values())
    assert runs[0].scores[("toy:cf", "margin_loglik")][0].value == pytest.approx(2.0 + 0.25)  # mean of the groups


def test_new_run_folders_keep_both_margins(tmp_path):
    root = tmp_path / "exp"
    items = {step: [{**row, "margin_loglik": row["margin"] + 5} for row in old_items(0.0)] for step in STEPS}
    write_run(root, "A", 0, STEPS, [4.0, 3.5], {"toy": {"chance": 0.25, "primary": "acc_per_char", "items": items}})
    (run,), _ = load_runs(root)
    info = task_infos([run])["toy:cf"]
    assert {"margin", "margin_loglik"} <= set(info.metrics)
    margin, loglik = run.scores[("toy:cf", "margin")], run.scores[("toy:cf", "margin_loglik")]
    assert [p.value + 5 for p in margin] == pytest.approx([p.value for p in loglik])
    row = run.items(info, STEPS[0])["1"]
    assert row["margin"] == pytest.approx(0.1) and row["margin_loglik"] == pytest.approx(5.1)
