"""`ablate eval PATH --every-checkpoint`: every kept checkpoint of every run scored once, as `ablate eval` would."""

import json

import pytest

from ablate import rundir
from conftest import TINY, run_cli

pytestmark = pytest.mark.slow  # every test scores checkpoints of runs the CLI trains


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """The tiny experiment's two variants, 8 steps, checkpoints at steps 4 and 8."""
    out = tmp_path_factory.mktemp("score")
    run_cli("run", str(TINY), "--out", str(out))
    return out / "tiny"


def _evals(run_dir):
    return [(r["step"], r["task"]) for r in rundir.read_jsonl(run_dir / rundir.EVALS)]


def test_scores_each_checkpoint_once_then_only_what_is_missing(experiment):
    mha, mqa = experiment / "mha" / "seed0", experiment / "mqa" / "seed0"
    first = run_cli("eval", str(experiment), "--every-checkpoint", "--tasks", "copa", "--limit", "6")
    assert "scored 4 checkpoint(s)" in first.stdout, first.stdout
    for run_dir in (mha, mqa):
        assert _evals(run_dir) == [(4, "copa"), (8, "copa")]
        rows = [json.loads(line) for line in rundir.items_path(run_dir, 4, "copa_cf").read_text().splitlines()]
        assert len(rows) == 6
    # the same call again scores nothing; a new task is scored at every checkpoint, the old one left alone
    again = run_cli("eval", str(experiment), "--every-checkpoint", "--tasks", "copa,piqa", "--limit", "6")
    assert "scored 4 checkpoint(s)" in again.stdout
    assert _evals(mha) == [(4, "copa"), (8, "copa"), (4, "piqa"), (8, "piqa")]
    none = run_cli("eval", str(mha), "--every-checkpoint", "--tasks", "copa,piqa", "--limit", "6")
    assert "scored 0 checkpoint(s)" in none.stdout
    rescored = run_cli("eval", str(mha), "--every-checkpoint", "--tasks", "copa", "--limit", "6", "--rescore")
    assert "scored 2 checkpoint(s)" in rescored.stdout and _evals(mha)[-2:] == [(4, "copa"), (8, "copa")]


def test_the_scores_equal_a_single_checkpoint_eval(experiment):
    """The tokenization shared across runs changes no number: step 4 of mqa scored alone gives the same metrics."""
    from ablate.eval import engine, suite
    from ablate.eval.load import load_model

    mqa = experiment / "mqa" / "seed0"
    run_cli("eval", str(experiment), "--every-checkpoint", "--tasks", "copa", "--limit", "6")
    shared = next(r for r in rundir.read_jsonl(mqa / rundir.EVALS) if r["step"] == 4 and r["task"] == "copa")
    loaded = load_model(mqa / rundir.CHECKPOINTS / rundir.step_dir_name(4))
    lm = engine.for_transformer(loaded.model, max_len=loaded.run.data.seq_len)
    [alone] = suite.evaluate(lm, loaded.tokenizer(), ["copa"], limit=6)
    assert shared["metrics"] == pytest.approx(alone.metrics, abs=1e-6)


def test_a_run_being_trained_is_skipped_and_said(experiment):
    mha = experiment / "mha" / "seed0"
    lock = rundir.RunLock(mha)
    assert lock.acquire()
    try:
        result = run_cli("eval", str(mha), "--every-checkpoint", "--tasks", "boolq", "--limit", "4")
    finally:
        lock.release()
    assert "being trained by a live process" in result.stdout and "scored 0 checkpoint(s)" in result.stdout
    assert not any(task == "boolq" for _, task in _evals(mha))


def test_wrong_combinations_are_refused(experiment, tmp_path):
    result = run_cli("eval", str(experiment), "--every-checkpoint", "--no-write", check=False)
    assert result.returncode == 2 and "--every-checkpoint" in result.stderr and len(result.stderr.splitlines()) == 1
    empty = run_cli("eval", str(tmp_path), "--every-checkpoint", "--tasks", "copa", check=False)
    assert empty.returncode == 2 and "no run folder" in empty.stderr
