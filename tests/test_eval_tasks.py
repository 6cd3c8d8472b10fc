"""The tasks read from disk beyond the first eleven (MMLU, ARC's test splits, copycolors), grouped tasks (per-group
sampling, macro-average), named suites and `ablate eval --list`, and agreement with lm-eval's HF backend."""

import json
import math
from collections import Counter
from dataclasses import replace

import pytest

import ablate_evals
from ablate.config import ConfigError
from ablate.eval import suite
from ablate.eval.metrics import METRICS
from ablate.eval.tasks import render
from conftest import TINY, run_cli

NEW_TASKS = ["mmlu", "arc_easy_test", "arc_challenge_test", "copycolors", "copycolors_xl"]


@pytest.mark.parametrize(
    "name, count, context_end, choices, gold",
    [
        (
            "mmlu",
            14042,
            "Statement 2 | The set of rotations in a dihedral group form a cyclic subgroup.\nAnswer:",
            [" True, True", " False, False", " True, False", " False, True"],
            3,
        ),
        (
            "arc_easy_test",
            2376,
            "Question: Which of these is the fundamental unit of life?\nAnswer:",
            [" system", " organ", " tissue", " cell"],
            3,
        ),
        (
            "arc_challenge_test",
            1172,
            "Which will most likely happen to the area as a result?\nAnswer:",
            [
                " Nitrogen will replace oxygen in the water.",
                " The temperature of the water will increase.",
                " Wave action will carry away the dead algae.",
                " Bottom dwellers will die and fish will swim away.",
            ],
            3,
        ),
        (
            "copycolors",
            100,
            "Question: A heart is red. What color is a heart?\n A. red\n B. yellow\n C. pink\n D. green\n"
            " E. brown\n F. orange\n G. white\n H. grey\n I. black\n J. blue\nAnswer:",
            [f" {c}" for c in "ABCDEFGHIJ"],
            0,
        ),
        (
            "copycolors_xl",
            1000,
            "Question: The outside of a coconut is brown. What color is the outside of a coconut?\n"
            " A. blue\n B. brown\n C. black\n D. green\n E. pink\n F. white\n G. orange\n H. yellow\n I. red\n J. "
            "purple\n"
            "Answer:",
            [f" {c}" for c in "ABCDEFGHIJ"],
            1,
        ),
    ],
)
def test_new_task_counts_and_first_item(name, count, context_end, choices, gold):
    task = ablate_evals.TASKS[name]
    items = task.items(None)
    assert len(items) == len(task.rows()) == count
    assert len({i.id for i in items}) == count  # ids are unique
    first = task.items(1)[0]
    assert first == items[0] and len(first.contexts) == 1
    assert first.contexts[0].endswith(context_end) and first.continuations == choices and first.gold == gold
    assert first.contexts[0].startswith("Question: ")


def test_mmlu_first_item_is_a_subject_question_with_its_answer():
    first = ablate_evals.TASKS["mmlu"].items(1)[0]
    assert first.group == "abstract_algebra"
    assert first.contexts[0] == (
        "Question: Statement 1 | If a and b are elements of a group and a is not equal to b, "
        "then a^2 is not equal to b^2. Statement 2 | The set of rotations in a dihedral group "
        "form a cyclic subgroup.\nAnswer:"
    )
    assert first.choice_texts[first.gold] == "False, True"


@pytest.mark.parametrize("name", ["arc_easy_test", "arc_challenge_test", "copycolors", "copycolors_xl"])
def test_request_file_tasks_score_what_the_file_asks(name):
    """Every item's requests are the request file's: ARC's test items zero-shot (the document's own query and
    choices, without the file's 5-shot examples), copycolors' its whole 3-shot context and letters, in CF and MCF."""
    task = ablate_evals.TASKS[name]
    rows = task.rows()
    for item, i in zip(task.items(None), task.order()):
        row = rows[i]
        assert item.gold == row["doc"]["gold"] and item.id == row["native_id"]
        if name.startswith("arc"):
            assert render(item, "cf") == ([row["doc"]["query"]], [f" {c}" for c in row["doc"]["choices"]])
            assert render(item, "cf")[1] == row["continuations"]
            assert all(c.endswith(row["doc"]["query"]) for c in row["contexts"])  # its 5-shot contexts end so
        else:
            assert len(set(row["contexts"])) == 1
            assert render(item, "cf") == render(item, "mcf") == (row["contexts"][:1], row["continuations"])
    if name == "copycolors_xl":  # the cyclic variants put each question's answer at every letter once
        assert Counter(item.gold for item in task.items(None)) == {g: 100 for g in range(10)}


def test_mmlu_limit_samples_every_subject_alike():
    task = ablate_evals.TASKS["mmlu"]
    by_subject = {}
    for item in task.items(None):
        by_subject.setdefault(item.group, []).append(item.id)
    assert len(by_subject) == 57 and min(map(len, by_subject.values())) == 100
    for limit in (57 * 3, 1000):
        items = task.items(limit)
        counts = Counter(item.group for item in items)
        assert len(items) == limit and len(counts) == 57 and max(counts.values()) - min(counts.values()) <= 1
        for subject, n in counts.items():  # each subject's items: a prefix of its own fixed order
            assert [i.id for i in items if i.group == subject] == by_subject[subject][:n]
    assert [i.id for i in task.items(57 * 3)] == [i.id for i in task.items(1000)[: 57 * 3]]
    assert by_subject["anatomy"] != sorted(by_subject["anatomy"])  # a fixed-seed shuffle, not the file's order
    assert Counter(item.group for item in task.items(6000))["abstract_algebra"] == 100  # a small subject runs out
    assert len(task.items(6000)) == 6000  # and the others fill the limit


def test_macro_average_on_a_hand_made_example():
    """Group a: 1, 0, 1, 1 (mean .75, stderr .5/2); group b: 0, 0 (mean 0, stderr 0). The task's value is the mean of
    the groups' means, .375 (the items' mean would be .667), its stderr sqrt(.25**2 + 0) / 2."""
    values, groups = [1, 0, 1, 1, 0, 0], ["a", "a", "a", "a", "b", "b"]
    rows = [{name: float(v) for name in METRICS} for v in values]
    means, stderrs, per_group = suite.macro_average(rows, groups)
    assert per_group["a"]["acc_raw"] == 0.75 and per_group["b"]["acc_raw"] == 0.0 and list(per_group) == ["a", "b"]
    assert means["acc_raw"] == pytest.approx(0.375) and stderrs["acc_raw"] == pytest.approx(0.25 / 2)
    assert set(means) == set(stderrs) == set(METRICS)


def test_suites_expand_wherever_tasks_are_named():
    """Each suite (read from its owner, ablate_evals.SUITES, not restated here) names known tasks, each once, and
    expands to them in its order wherever task names are accepted, mixed with task names."""
    tasks, suites = ablate_evals.TASKS, ablate_evals.SUITES
    assert not set(suites) & set(tasks) and all(set(members) <= set(tasks) for members in suites.values())
    assert all(len(set(members)) == len(members) > 0 for members in suites.values())
    for name, members in suites.items():
        assert suite.parse_tasks(name) == members
    assert suite.parse_tasks("all") == list(tasks)
    small = suites["small"]
    outside, inside = next(t for t in tasks if t not in small), small[-1]
    assert suite.parse_tasks(f"small, {outside},{inside}") == small + [outside]  # mixed, each task once
    inside = suites["core"][-1]  # a task named before its suite keeps its place
    assert suite.parse_tasks(f"{inside},core") == [inside] + [t for t in suites["core"] if t != inside]
    suite.check_config_tasks(f"small,{small[0]}")
    with pytest.raises(
        ConfigError,
        match=rf"eval.tasks: unknown task 'smal'; allowed: arc_easy, .*; or a suite: {', '.join(suites)}$",
    ):
        suite.check_config_tasks("smal")


def test_lm_eval_configs_are_written_from_the_task_list(tmp_path, capsys):
    """evals/lm_eval_tasks/ablate_*.yaml are what the generator writes from ablate_evals.TASKS (after adding a
    task: `python -m ablate_evals.lm_eval_tasks.generate`); a task added to the list gets its configs, and a
    changed file or one of no task is found."""
    from ablate_evals.lm_eval_tasks import generate

    assert generate.main(["--check"]) == 0, capsys.readouterr().out
    kinds = {name: task.kind for name, task in ablate_evals.TASKS.items()}
    assert set(generate.configs()) == {f"ablate_{n}.yaml" for n in kinds} | {
        f"ablate_{n}_mcf.yaml" for n, kind in kinds.items() if kind == "choice"
    }
    toy = {name: replace(ablate_evals.TASKS[like], name=name) for name, like in (("toy", "copa"), ("lm", "lambada"))}
    assert generate.write(tmp_path, toy) == ["ablate_toy.yaml", "ablate_toy_mcf.yaml", "ablate_lm.yaml"]
    mcf, lm = (tmp_path / "ablate_toy_mcf.yaml").read_text(), (tmp_path / "ablate_lm.yaml").read_text()
    assert "task: ablate_toy_mcf\ndataset_kwargs:\n  task: toy\n  format: mcf\n" in mcf and "  task: lm\n" in lm
    (tmp_path / "ablate_toy.yaml").write_text("task: ablate_toy\n")
    (tmp_path / "ablate_gone.yaml").write_text("task: ablate_gone\n")
    assert generate.stale(tmp_path, toy) == ["ablate_toy.yaml", "ablate_gone.yaml"]
    assert generate.write(tmp_path, toy) == ["ablate_toy.yaml", "ablate_gone.yaml"]
    assert generate.stale(tmp_path, toy) == [] and not (tmp_path / "ablate_gone.yaml").exists()


@pytest.mark.slow
def test_cli_eval_list_and_path_required():
    result = run_cli("eval", "--list", "--limit", "500")
    lines = result.stdout.splitlines()
    mmlu = next(line for line in lines if line.startswith("mmlu "))
    assert mmlu.split()[:4] == ["mmlu", "14042", "500", "acc_per_char"] and "MMLU (test, 14042 items" in mmlu
    assert next(line for line in lines if line.startswith("copa ")).split()[1:3] == ["100", "100"]
    core = next(line for line in lines if line.startswith("core "))
    assert core.split()[1:4] == ["11", "22061", "4899"]
    assert any(line.startswith("small ") for line in lines) and any(line.startswith("all ") for line in lines)
    result = run_cli("eval", "--tasks", "mmlu", check=False)
    assert result.returncode == 2 and "a run folder or checkpoint to score is required (or --list)" in result.stderr


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny experiment trained 8 steps, seq_len 256 (copycolors' 3-shot contexts are ~300 tokens: cut by both
    tools alike), and its transformers export."""
    from ablate.setup.experiment import load_experiment
    from ablate.eval.export import export_hf
    from ablate.training.run import run_dir_for, train

    out = tmp_path_factory.mktemp("taskruns")
    run = load_experiment(TINY, only=["mha"], overrides={"data.seq_len": "256"})[0]
    train(run, out)
    run_dir = run_dir_for(out, run)
    export_hf(run_dir, out / "hf")
    return run_dir, out / "hf"


def test_evaluate_mmlu_records_subjects(tiny_run):
    """A grouped task end to end: evals.jsonl's metrics are the means over subjects of "groups", the items carry
    their subject."""
    from ablate.eval import engine
    from ablate.eval.load import load_model

    run_dir, _ = tiny_run
    loaded = load_model(run_dir)
    lm = engine.for_transformer(loaded.model)
    [result] = suite.evaluate(lm, loaded.tokenizer(), ["mmlu"], limit=114, batch_size=16)
    record = json.loads(json.dumps(result.record(8, 0)))
    assert record["n"] == 114 and len(record["groups"]) == 57 and record["chance"] == 0.25
    for metric in ("acc_raw", "acc_per_char", "gold_bpb"):
        by_items = {}
        for row in result.items:
            by_items.setdefault(row["group"], []).append(row[metric])
        assert all(len(v) == 2 for v in by_items.values())
        assert record["groups"]["anatomy"][metric] == pytest.approx(sum(by_items["anatomy"]) / 2)
        assert record["metrics"][metric] == pytest.approx(sum(g[metric] for g in record["groups"].values()) / 57)
        assert not math.isnan(record["stderr"][metric])
    [plain] = suite.evaluate(lm, loaded.tokenizer(), ["copa"], limit=4)
    assert "groups" not in plain.record(8, 0) and "group" not in plain.items[0]


@pytest.mark.slow
def test_agreement_with_lm_eval_hf_on_new_tasks(tiny_run):
    """ablate's engine on the ablate model vs lm-eval's HF backend on the exported model, on the same first 20
    items of each new task: the same chosen answers and accuracies. (MMLU's first 20 items are 20 subjects' first,
    so its macro-average equals lm-eval's mean over items here.)"""
    from ablate.eval import agreement, engine
    from ablate.eval.load import load_model

    run_dir, hf_dir = tiny_run
    loaded = load_model(run_dir)
    ours = suite.evaluate(
        engine.for_transformer(loaded.model), loaded.tokenizer(), NEW_TASKS, limit=20, batch_size=8, log_samples=True
    )
    assert sum(r.truncated for r in ours if r.task.startswith("copycolors")) > 0  # long contexts were cut
    reference = agreement.run_lm_eval_hf(str(hf_dir), NEW_TASKS, limit=20, batch_size=8)
    report = agreement.compare(ours, reference)
    assert set(report) == set(NEW_TASKS)
    for task, row in report.items():
        assert row["items"] == 20
        assert row["same_raw"] >= 0.995 and row["acc_raw_diff_points"] <= 0.2, (task, row)
        assert row["same_per_char"] >= 0.995 and row["acc_per_char_diff_points"] <= 0.2, (task, row)


def test_macro_average_of_single_item_groups_keeps_a_standard_error():
    """20 items over 20 subjects (a small --limit of MMLU): each subject's own spread is unknown, so each takes
    the items' sample sd: the stderr equals the plain one, never 0."""
    from ablate.eval.metrics import METRICS, aggregate

    values = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0] * 2
    rows = [{name: v for name in METRICS} for v in values]
    means, stderrs, _ = suite.macro_average(rows, [f"s{i}" for i in range(20)])
    _, plain = aggregate(rows)
    assert stderrs["acc_raw"] == pytest.approx(plain["acc_raw"]) and stderrs["acc_raw"] > 0
