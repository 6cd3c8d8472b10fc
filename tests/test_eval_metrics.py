"""The per-item metrics of both task kinds on hand-computed examples, and the kind's metric set in the aggregate."""

import math

import pytest

from ablate.eval.metrics import CONTINUATION_METRICS, METRICS, METRICS_BY_KIND, ItemScores, aggregate, item_metrics
from ablate.eval.tasks import Task


def choice_item(gold: int) -> ItemScores:
    # per-character log-likelihoods: -2/2 = -1, -4/4 = -1, -10/5 = -2
    return ItemScores(
        logprobs=[-2.0, -4.0, -10.0],
        unconditional=[-1.0, -3.0, -4.0],
        tokens=[1, 2, 3],
        chars=[2, 4, 5],
        bytes=[2, 4, 5],
        gold=gold,
    )


def test_datadecide_probabilities_per_character():
    m = item_metrics(choice_item(gold=1))
    assert list(m) == list(METRICS)
    # CORRECT_PROB: exp(-4 / 4); TOTAL_PROB: e^-1 + e^-1 + e^-2; NORM_CORRECT_PROB: their ratio = 1 / (2 + e^-1)
    assert m["correct_prob"] == pytest.approx(math.exp(-1))
    assert m["total_prob"] == pytest.approx(2 * math.exp(-1) + math.exp(-2))
    assert m["norm_correct_prob"] == pytest.approx(1 / (2 + math.exp(-1)))
    assert m["acc_per_char"] == 0.0  # the tie at -1 per char goes to choice 0: the share still says "close"
    worst = item_metrics(choice_item(gold=2))
    assert worst["correct_prob"] == pytest.approx(math.exp(-2)) and worst["total_prob"] == pytest.approx(
        m["total_prob"]
    )
    assert worst["norm_correct_prob"] == pytest.approx(math.exp(-2) / (2 * math.exp(-1) + math.exp(-2)))
    # the per-character shares of the choices sum to 1
    shares = sum(item_metrics(choice_item(g))["norm_correct_prob"] for g in range(3))
    assert shares == pytest.approx(1.0)


def test_probabilities_use_characters_and_bpb_bytes():
    s = ItemScores(
        logprobs=[-6.0, -1.0], unconditional=[-1.0, -1.0], tokens=[2, 1], chars=[3, 1], bytes=[6, 1], gold=0
    )  # a 3-character, 6-byte answer (non-ASCII)
    m = item_metrics(s)
    assert m["correct_prob"] == pytest.approx(math.exp(-2))
    assert m["gold_bpb"] == pytest.approx(6 / (6 * math.log(2)))
    assert m["total_prob"] == pytest.approx(math.exp(-2) + math.exp(-1))


def test_continuation_metrics():
    hit = ItemScores(logprobs=[-6.0], unconditional=[], tokens=[2], chars=[6], bytes=[8], gold=0, greedy=[True])
    m = item_metrics(hit, "continuation")
    assert list(m) == list(CONTINUATION_METRICS)
    assert m == pytest.approx(
        {"acc_greedy": 1.0, "gold_logprob": -6.0, "gold_bpb": 6 / (8 * math.log(2)), "correct_prob": math.exp(-1)}
    )
    miss = ItemScores(logprobs=[-6.0], unconditional=[], tokens=[2], chars=[6], bytes=[8], gold=0, greedy=[False])
    assert item_metrics(miss, "continuation")["acc_greedy"] == 0.0
    means, stderrs = aggregate([m, item_metrics(miss, "continuation")], CONTINUATION_METRICS)
    assert set(means) == set(stderrs) == set(CONTINUATION_METRICS)
    assert means["acc_greedy"] == 0.5 and stderrs["acc_greedy"] == pytest.approx(0.5)  # sd 0.707 / sqrt(2)
    with pytest.raises(ValueError, match="kind: 'generate'; allowed: choice, continuation"):
        item_metrics(hit, "generate")


def test_task_kind_and_primary_are_checked():
    def build(row, index):
        raise AssertionError("never built")

    with pytest.raises(ValueError, match="task t: kind 'cloze'; allowed: choice, continuation"):
        Task(name="t", data="x", build=build, primary="acc_raw", kind="cloze")
    with pytest.raises(ValueError, match="task t: primary 'margin'; allowed for a continuation task: acc_greedy"):
        Task(name="t", data="x", build=build, primary="margin", kind="continuation")
    task = Task(name="t", data="x", build=build, primary="gold_bpb", kind="continuation")
    assert task.primary_for("mcf") == "gold_bpb" and "acc_greedy" not in METRICS_BY_KIND["choice"]
