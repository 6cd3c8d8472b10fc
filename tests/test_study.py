"""`ablate run FILE --until-decided`: the rule recorded before training, rounds, resumption, a changed rule, the
budget stop, rounds through the local submitit launcher, and `ablate status` showing the contrasts."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ablate import rundir
from ablate.launch.study import next_seeds
import ablate.cli.run
from conftest import REPO, cli_in_process

STUDY_FILE = REPO / "tests" / "experiments" / "tiny_study.py"
VARIANTS = ("baseline", "twin", "loser")


def study(out) -> dict:
    return json.loads((Path(out) / "tiny_study" / rundir.STUDY).read_text())


def summaries(out) -> dict[str, float]:
    """{run folder: its summary.json's mtime}: what a rerun must leave alone."""
    return {str(p.parent): p.stat().st_mtime_ns for p in sorted(Path(out).glob(f"tiny_study/*/*/{rundir.SUMMARY}"))}


# The driver's mechanics, under the anytime design (the group-sequential one's own tests are below). No margin:
# baseline vs twin (one part in a million apart) can never end equivalent; its tiny LR gap moves the validation loss
# by ~3e-7 nats the same way on every seed, open at 3 seeds (t* 14.8) and decided at 4
COMMAND = ("run", STUDY_FILE, "--until-decided", "--max-seeds", "4", "--only", "baseline,twin", "--design", "anytime")


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A study whose round 1 trained and whose round 2 was cut off before it trained (exit 130, as after Ctrl-C),
    with what the study folder held when round 1 started."""
    out = tmp_path_factory.mktemp("study")
    seen, train_runs = {}, ablate.cli.run.train_runs

    def first_round_only(runs, args, in_study=False):
        folder = out / "tiny_study"
        if not seen:  # round 1, before any run
            seen["study"] = json.loads((folder / rundir.STUDY).read_text())
            seen["summaries"] = list(folder.glob(f"*/*/{rundir.SUMMARY}"))
            return train_runs(runs, args, in_study)
        seen["round 2"] = sorted(f"{r.config.name} seed{r.config.train.seed}" for r in runs)
        return 130

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ablate.cli.run, "train_runs", first_round_only)
        result = cli_in_process(*COMMAND, "--out", out, check=False)
    return out, seen, result


@pytest.mark.slow
def test_the_rule_is_recorded_before_the_first_run(interrupted):
    out, seen, result = interrupted
    assert result.returncode == 130, result.stdout + result.stderr
    assert seen["summaries"] == []  # nothing had results when the rule was written
    before = seen["study"]
    assert before["rule"]["max_seeds"] == 4 and before["rule"]["metrics"] == ["val_loss"]
    assert [(r["round"], r["contrasts"]) for r in before["rounds"]] == [(1, None)]  # planned, not run yet
    assert before["rule_history"] == [{"rule": before["rule"], "set_after_results": False, "round": 1}]
    assert seen["round 2"] == ["baseline seed3", "twin seed3"]  # one more seed for each variant still open
    rounds = study(out)["rounds"]
    assert [r["round"] for r in rounds] == [1, 2] and rounds[1]["contrasts"] is None  # round 2: planned, not run
    assert rounds[0]["seeds"] == {"baseline": [0, 1, 2], "twin": [0, 1, 2]}
    assert rounds[0]["tokens"] == 6 * 40 * 8 * 32 and rounds[0]["device_seconds"] > 0
    assert [c["decision"] for c in rounds[0]["contrasts"]] == ["open"]
    assert "val_loss  baseline vs twin: open  (3 seeds" in result.stdout


@pytest.mark.slow
def test_an_interrupted_study_continues_where_it_stopped(interrupted, tmp_path):
    out = tmp_path / "runs"
    shutil.copytree(interrupted[0], out)
    round_one = summaries(out)
    result = cli_in_process(*COMMAND, "--out", out)
    assert "study round 2: 2 runs: baseline seed3, twin seed3" in result.stdout
    assert "study round 1" not in result.stdout
    after = summaries(out)
    assert {k: after[k] for k in round_one} == round_one  # round 1's runs were not trained again
    assert len(after) == 8
    recorded = study(out)
    assert [r["round"] for r in recorded["rounds"]] == [1, 2] and recorded["stopped"] == "decided"
    assert recorded["rounds"][1]["contrasts"][0]["seeds"] == 4
    assert "study stopped after round 2 (decided)" in result.stdout
    shown = cli_in_process("status", out / "tiny_study").stdout
    assert "study tiny_study" in shown and "after round 2:" in shown and "stopped: decided" in shown
    assert "val_loss  baseline vs twin: decided: twin better  (4 seeds, interval of a-b [" in shown
    again = cli_in_process(*COMMAND, "--out", out)  # a stopped study stops again, training nothing
    assert "study stopped after round 2 (decided)" in again.stdout and summaries(out) == after


@pytest.mark.slow
def test_a_changed_rule_is_refused_unless_a_new_study_starts(interrupted, tmp_path):
    out = tmp_path / "runs"
    shutil.copytree(interrupted[0], out)
    recorded = study(out)
    refused = cli_in_process(*COMMAND, "--out", out, "--alpha", "0.1", check=False)
    assert refused.returncode == 2 and "alpha: 0.05 -> 0.1" in refused.stderr and "--new-study" in refused.stderr
    assert study(out) == recorded
    result = cli_in_process(*COMMAND, "--out", out, "--max-seeds", "3", "--new-study")
    kept = json.loads((out / "tiny_study" / "study.1.json").read_text())
    assert kept == recorded
    new = study(out)
    assert [h["set_after_results"] for h in new["rule_history"]] == [False, True]  # changed after results
    assert new["rule"]["max_seeds"] == 3 and new["stopped"] == "max_seeds"
    assert "study round 1: 6 runs" in result.stdout  # the runs were there: skipped, nothing trained again


@pytest.mark.slow
def test_more_seeds_continue_an_anytime_study_and_are_refused_by_a_group_sequential_one(interrupted, tmp_path):
    """Where a study stops is no part of the anytime design's guarantee: a larger --max-seeds continues the same
    study (its history records the change). The group-sequential design fixed its looks against max_seeds: the same
    change after results is refused, naming why and the ways out."""
    out = tmp_path / "runs"
    shutil.copytree(interrupted[0], out)
    result = cli_in_process(*COMMAND, "--out", out, "--max-seeds", "5")
    assert "study rule changed where it stops only (max_seeds: 4 -> 5): continued" in result.stdout
    continued = study(out)
    assert continued["rule"]["max_seeds"] == 5 and [h["rule"]["max_seeds"] for h in continued["rule_history"]] == [4, 5]
    assert not (out / "tiny_study" / "study.1.json").exists()
    gs_out = tmp_path / "gs"
    first = ("run", STUDY_FILE, "--until-decided", "--max-seeds", "3", "--only", "baseline,twin")
    cli_in_process(*first, "--out", gs_out)
    recorded = study(gs_out)
    assert recorded["rule"]["design"] == "group_sequential"
    refused = cli_in_process(*first[:-4], "--max-seeds", "4", "--only", "baseline,twin", "--out", gs_out, check=False)
    assert refused.returncode == 2 and "max_seeds: 3 -> 4" in refused.stderr
    assert "voids its error guarantee" in refused.stderr and "--design anytime" in refused.stderr
    assert study(gs_out) == recorded


def test_a_study_recorded_before_designs_continues_under_anytime(tmp_path):
    """study.json without a design (written before designs existed) is read as the anytime design it ran under,
    and the default command continues it instead of refusing a changed rule."""
    from ablate.launch.study import as_recorded, record_rule
    from ablate.report.sections.sequential.rule import DecisionRule

    rule = DecisionRule(max_seeds=4)
    old = {k: v for k, v in rule.to_dict().items() if k not in ("design", "spending", "futility")}
    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / rundir.STUDY).write_text(json.dumps({"rule": old, "rule_history": [], "rounds": [], "stopped": None}))
    assert DecisionRule.from_dict(old).design == "anytime"
    assert as_recorded(rule, {"rule": old}).design == "anytime"
    assert record_rule(folder, rule, new_study=False)["rule"] == old  # continued: nothing rewritten


@pytest.mark.slow
def test_the_budget_stops_before_a_round_that_would_exceed_it(interrupted, tmp_path):
    out = tmp_path / "runs"
    shutil.copytree(interrupted[0], out)
    round_one = 6 * 40 * 8 * 32  # tokens: 6 runs of 40 steps x 8 sequences x 32 tokens
    result = cli_in_process(*COMMAND, "--out", out, "--new-study", "--budget", str(round_one + 1000))
    assert study(out)["stopped"] == "budget" and len(study(out)["rounds"]) == 1
    assert "study stopped after round 1 (budget): the next round (2 runs)" in result.stdout
    recorded = study(out)
    too_small = cli_in_process(*COMMAND, "--out", out, "--new-study", "--budget", "1000", check=False)
    assert too_small.returncode == 2 and "round 1 alone" in too_small.stderr and study(out) == recorded


@pytest.mark.slow
def test_three_variants_decide_in_round_one(tmp_path):
    """The issue's study under the default group-sequential design: the loser (LR / 100) is worse than both, and
    baseline and twin end equivalent within the margin, at the file's 3 seeds (the anytime design needed a 4th: its
    interval at 3 seeds is wider, and the validation documents' own noise, the same on every seed, widens both)."""
    result = cli_in_process("run", STUDY_FILE, "--until-decided", "--margin", "val_loss=0.01", "--out", tmp_path)
    contrasts = {(c["a"], c["b"]): c["decision"] for c in study(tmp_path)["rounds"][-1]["contrasts"]}
    assert contrasts == {("baseline", "twin"): "equivalent", ("baseline", "loser"): "a", ("twin", "loser"): "a"}
    rounds = study(tmp_path)["rounds"]
    assert study(tmp_path)["stopped"] == "decided" and len(rounds) == 1
    assert rounds[0]["contrasts"][0]["decision"] == "equivalent"  # the twins at the file's seeds already
    assert f"study stopped after round {len(rounds)} (decided)" in result.stdout


@pytest.mark.slow
def test_rounds_through_the_local_launcher(tmp_path):
    """Each round's runs as submitit jobs (its local executor), waited for before the round's contrasts."""
    pytest.importorskip("submitit")
    flags = ("--seeds", "0,1", "--max-seeds", "3", "--launcher", "local", "--set", "train.max_steps=8")
    result = cli_in_process(*COMMAND, *flags, "--out", tmp_path)
    recorded = study(tmp_path)
    assert [r["round"] for r in recorded["rounds"]] == [1, 2] and recorded["stopped"] == "max_seeds"
    assert recorded["rounds"][1]["seeds"] == {"baseline": [2], "twin": [2]}
    assert result.stdout.count("submitted job ") == 6 and len(summaries(tmp_path)) == 6


def test_a_rounds_seeds_train_as_one_stack(tmp_path):
    """--stack with --until-decided: each round's runs of one shape train as one stacked model (issue 45), every
    member still its own run folder: round 1's four runs as one stack of 4, round 2's two as a stack of 2."""
    flags = ("--seeds", "0,1", "--max-seeds", "3", "--stack", "4", "--set", "train.max_steps=8")
    result = cli_in_process(*COMMAND, *flags, "--out", tmp_path)
    recorded = study(tmp_path)
    assert [r["round"] for r in recorded["rounds"]] == [1, 2] and recorded["stopped"] == "max_seeds"
    stacks = {}
    for folder in summaries(tmp_path):
        summary = json.loads((Path(folder) / rundir.SUMMARY).read_text())
        stacks.setdefault(summary["stack"]["members"], []).append(summary["stack"]["member"])
    assert {k: sorted(v) for k, v in stacks.items()} == {4: [0, 1, 2, 3], 2: [0, 1]}
    assert result.stdout.count("4 runs in 1 stacks of at most 4") == 1
    assert result.stdout.count("2 runs in 1 stacks of at most 4") == 1


def test_next_seeds_goes_to_open_variants_only():
    from ablate.report.sections.sequential.rule import DecisionRule

    rounds = {"rounds": [{"seeds": {"a": [0, 1, 2], "b": [0, 1, 2], "c": [0, 1, 2]}}]}
    contrasts = [
        {"a": "a", "b": "b", "decision": "open"},
        {"a": "a", "b": "c", "decision": "a"},
        {"a": "b", "b": "c", "decision": "equivalent"},
    ]
    assert next_seeds(rounds, DecisionRule(), contrasts) == ({"a": [3], "b": [3]}, None)
    assert next_seeds(rounds, DecisionRule(max_seeds=3), contrasts) == (None, "max_seeds")
    assert next_seeds(rounds, DecisionRule(), contrasts[1:]) == (None, "decided")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max-seeds", "4"], "--max-seeds: only with --until-decided"),
        (["--margin", "val_loss=0.01", "--new-study"], "--margin/--new-study: only with --until-decided"),
        (["--until-decided", "--budget", "3x"], "--budget 3x: allowed: training tokens"),
        (["--until-decided", "--margin", "val_loss"], "--margin val_loss: allowed: METRIC=VALUE"),
        (["--until-decided", "--max-seeds", "2"], "--max-seeds 2: allowed: a whole number >= 3"),
        (["--until-decided", "--margin", "hellaswag/acc=0.1"], "margins: 'hellaswag/acc' is not one of"),
    ],
)
def test_study_flags_are_checked_before_any_compute(flags, message, tmp_path):
    result = cli_in_process("run", STUDY_FILE, *flags, "--out", tmp_path, check=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "tiny_study").exists()


@pytest.mark.parametrize(
    "line, message",
    [
        ("decision = {'alpha': 0.1}", ":21: decision is a dict; allowed: ablate.DecisionRule("),
        ("decision = DecisionRule(alpha=2)", ":21: decision: alpha=2; allowed: a number between 0 and 1"),
    ],
)
def test_a_wrong_decision_in_the_file_is_one_line(line, message, tmp_path):
    text = STUDY_FILE.read_text().replace('decision = DecisionRule(metrics=("val_loss",), max_seeds=6)', line)
    assert line in text
    path = tmp_path / "bad_study.py"
    path.write_text(text)
    result = cli_in_process("plan", path, check=False)
    assert result.returncode == 2 and f"{path}{message}" in result.stderr, result.stderr


def test_importing_ablate_stays_quick_and_decision_rule_is_public():
    code = (
        "import sys, ablate; assert 'ablate.report' not in sys.modules and 'torch' not in sys.modules; "
        "from ablate import DecisionRule; print(DecisionRule().max_seeds)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "8\n"
