"""What the eval engine does and skips: the unconditional pass only for the metrics that need it, batches that
bound their padding, the dtype `ablate eval` scores in, and a report over runs scored on some metrics only."""

import json

import pytest
import torch

from ablate.config import ModelConfig
from ablate.eval import engine, suite
from ablate.eval.metrics import METRICS, UNCONDITIONAL_METRICS
from ablate.model import Transformer
from conftest import TINY, cli_in_process, run_cli


@pytest.fixture(scope="module")
def lm():
    model = Transformer(ModelConfig(vocab_size=300, d_model=32, n_layers=2, n_heads=4), max_seq_len=128)
    model.init_weights(torch.Generator().manual_seed(0))
    return engine.for_transformer(model.eval())


def test_unconditional_pass_runs_only_for_the_metrics_that_need_it(lm, tokenizer):
    tasks = ["arc_easy", "arc_challenge"]  # primaries acc_per_char and acc_pmi
    full = {r.task: r for r in suite.evaluate(lm, tokenizer, tasks, limit=6, log_samples=True)}
    some = {r.task: r for r in suite.evaluate(lm, tokenizer, tasks, limit=6, log_samples=True, metrics="acc_raw")}
    pmi = {r.task: r for r in suite.evaluate(lm, tokenizer, tasks, limit=6, log_samples=True, metrics="acc_pmi")}

    def requests(result, conditional=None):
        rows = [s for s in result.samples if s["type"] == "request"]
        return [s for s in rows if conditional is None or s["conditional"] == conditional]

    choices = sum(len(s["choices"]) for s in full["arc_easy"].samples if s["type"] == "item")
    assert len(requests(full["arc_easy"])) == 2 * choices  # every metric: the unconditional pass as well
    assert len(requests(some["arc_easy"])) == len(requests(some["arc_easy"], True)) == choices  # skipped
    assert len(requests(pmi["arc_easy"], False)) == choices  # asked for acc_pmi: it runs
    # arc_challenge's primary is acc_pmi: always computed, so its unconditional pass always runs
    assert len(requests(some["arc_challenge"], False)) == len(requests(some["arc_challenge"], True))

    assert list(some["arc_easy"].metrics) == ["acc_raw", "acc_per_char"]  # asked for, and the primary
    assert list(pmi["arc_easy"].metrics) == ["acc_per_char", "acc_pmi"]
    assert list(some["arc_challenge"].metrics) == ["acc_raw", "acc_pmi"] and list(full["arc_easy"].metrics) == list(
        METRICS
    )
    for part in (some, pmi):  # the same values as when every metric is computed
        for task, result in part.items():
            for name, value in result.metrics.items():
                assert value == pytest.approx(full[task].metrics[name], abs=1e-9), (task, name)
            assert set(result.items[0]) == {"id", "gold", *result.metrics}  # eval_items rows: those metrics only
    item = next(s for s in some["arc_easy"].samples if s["type"] == "item")
    assert set(item["predictions"]) == {"raw", "per_token", "per_char"}  # no PMI or choices-only choice
    table = suite.results_table(list(some.values())).splitlines()
    assert table[2].split()[4:6] == ["acc_per_char", f"{some['arc_easy'].metrics['acc_per_char']:.3f}"]
    assert "-" in table[2].split()  # a metric not computed prints "-"

    with pytest.raises(ValueError, match=r"--metrics: unknown metric 'acc_nope'; allowed: all, acc_raw"):
        suite.evaluate(lm, tokenizer, tasks, limit=6, metrics="acc_raw,acc_nope")
    assert suite.parse_metrics("all") is None and suite.parse_metrics("") is None
    assert set(UNCONDITIONAL_METRICS) <= set(METRICS)


def test_batches_hold_at_most_batch_size_rows_and_little_padding():
    lengths = [300, 120, 118, 117, 110, 100, 99, 98, 97, 96, 20, 19, 19, 18, 5]
    rows = [engine._Row(list(range(n)), list(range(n)), [0] * n) for n in lengths]
    batches = engine._batches(rows, batch_size=4)
    assert [len(r.tokens) for b in batches for r in b] == lengths  # every row once, longest first
    for batch in batches:
        real = sum(len(r.tokens) for r in batch)
        assert len(batch) <= 4
        assert len(batch) == 1 or len(batch[0].tokens) * len(batch) <= (1 + engine.MAX_PADDING) * real
    assert [len(b) for b in batches][:1] == [1]  # the one long row is not padded with the 120-token ones


def test_eval_dtype_follows_the_run():
    assert engine.eval_dtype(None, "auto", "cpu") == "fp32" and engine.eval_dtype(None, "auto", "cuda") == "bf16"
    assert engine.eval_dtype(None, "bf16", "cpu") == "bf16" and engine.eval_dtype("fp32", "bf16", "cpu") == "fp32"
    assert engine.autocast_for("fp32", "cpu") is None
    assert engine.autocast_for("bf16", "cpu").fast_dtype == torch.bfloat16


def test_cli_refuses_an_unknown_metric_before_loading(tmp_path):
    result = cli_in_process("eval", str(tmp_path), "--metrics", "acc_raw,acc_nope", check=False)
    assert result.returncode == 2 and "--metrics: unknown metric 'acc_nope'; allowed: all, acc_raw" in result.stderr


@pytest.mark.slow
def test_report_reads_runs_scored_on_some_metrics(tmp_path):
    """Runs trained without evals, scored afterwards without the unconditional pass: evals.jsonl and eval_items/
    lack those metrics, and `ablate report` compares the variants on the ones there."""
    run_cli("run", str(TINY), "--out", str(tmp_path))
    done = run_cli(
        "eval", str(tmp_path / "tiny"), "--every-checkpoint", "--tasks", "copa", "--limit", "10",
        "--metrics", "acc_raw,gold_bpb",
    )  # fmt: skip
    assert done.stdout.count("copa") == 4  # 2 runs x 2 checkpoints
    line = json.loads((tmp_path / "tiny" / "mha" / "seed0" / "evals.jsonl").read_text().splitlines()[-1])
    assert set(line["metrics"]) == set(line["stderr"]) == {"acc_raw", "gold_bpb"}
    run_cli("report", str(tmp_path / "tiny"), "--bootstrap", "100")
    report = json.loads((tmp_path / "tiny" / "report.json").read_text())
    copa = [s for g in report["groups"] for s in g["series"] if s["task"] == "copa:cf"]
    assert {s["metric"] for s in copa} == {"acc_raw", "gold_bpb"}
    assert all(s["has_items"] for s in copa)
