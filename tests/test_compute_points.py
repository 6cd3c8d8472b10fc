"""An arm at several budgets: compute_points() builds it, report/inputs/compute_points.py reads it back from run
folders (main runs apart from compute points, each point annealed or left out with its reason)."""

import pytest

from ablate import ConfigError, ModelConfig, RunConfig, ScheduleConfig, TrainConfig, compute_points, variant
from ablate.optim.schedule import lr_factor
from ablate.report.inputs.compute_points import split_budgets
from ablate.report.inputs.flops import flops_per_token
from ablate.report.inputs.runs import load_runs
from report_fixtures import write_run

BASE = RunConfig(
    experiment="points",
    model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
    schedule=ScheduleConfig(warmup=0.05),
    train=TrainConfig(max_steps=40, global_batch=4, micro_batch=4),
)


def test_compute_points_builds_annealed_budgets_from_one_wsd_run():
    parent, half, main = compute_points(BASE, "base", budgets=(0.5, 1, 2), decay=0.25)
    assert [r.name for r in (parent, half, main)] == ["base~2x", "base~0.5x", "base"]
    assert [r.train.max_steps for r in (parent, half, main)] == [80, 20, 40]
    assert parent.branch == {} and half.branch["parent"] == main.branch["parent"] == "base~2x"
    assert (half.branch["step"], main.branch["step"]) == (15, 30)  # each decays over its own last quarter
    # the 1x run's lr, the parent's up to the branch point and its own after, is that of a lone WSD run of 40 steps
    lone = variant(BASE, "lone", {"schedule.name": "wsd", "schedule.decay": 0.25}).schedule
    trained = [lr_factor(s, 80, parent.schedule) if s < 30 else lr_factor(s, 40, main.schedule) for s in range(40)]
    assert trained == [lr_factor(s, 40, lone) for s in range(40)]
    assert trained[29] == 1.0 and trained[-1] < 0.2  # stable at the branch point, decayed at the end
    with pytest.raises(ConfigError, match="1 among them"):
        compute_points(BASE, "base", budgets=(0.5, 2))


def _write(root, run: RunConfig, seed: int, val: float, finished: bool = True):
    """run's config as its folder holds it; the final validation loss `val`."""
    extra = {
        f"{s}.{k}": v for s, section in run.to_dict().items() if isinstance(section, dict) for k, v in section.items()
    }
    steps = run.train.max_steps
    write_run(root, run.name, seed, [steps // 2, steps], [val + 0.5, val], {}, finished, config_extra=extra)


def test_split_keeps_each_arm_once_at_the_main_budget(tmp_path):
    root = tmp_path / "points"
    losses = {"~2x": 3.0, "~0.5x": 3.6, "": 3.3}
    arms = {
        "base": compute_points(BASE, "base"),
        "mqa": compute_points(variant(BASE, "mqa", {"model.n_kv_heads": 1}), "mqa"),
        # another field than the budget: another arm, though its budget and name match base's
        "lr": compute_points(variant(BASE, "lr", {"optim.lr": 1e-3}), "lr", budgets=(1, 2)),
        # a constant schedule never anneals: at 2x it is no compute point
        "const": [
            variant(BASE, "const", {"schedule.name": "constant"}),
            variant(BASE, "const~2x", {"schedule.name": "constant", "train.max_steps": 80}),
        ],
    }
    for name, runs in arms.items():
        for run in runs:
            for seed in (0, 1):
                _write(root, run, seed, losses[run.name.removeprefix(name)] + 0.01 * seed)
    runs, _ = load_runs(root)
    split = split_budgets(runs, ["model.d_model"])
    assert sorted(r.label for r in split.main) == sorted(f"{a}/seed{s}" for a in arms for s in (0, 1))
    assert len(split.extra) == 2 * (2 + 2 + 1 + 1)
    by_run = {p.run: p for p in split.points}
    assert {p.arm for p in split.points} == set(arms) and all(p.rung == (32,) for p in split.points)
    assert by_run["base~0.5x/seed1"].arm == "base" and by_run["base~0.5x/seed1"].budget == (20, 0)
    assert by_run["base~0.5x/seed1"].loss == 3.61 and by_run["base~0.5x/seed1"].counts
    per_token = flops_per_token({"model": BASE.model.__dict__})[0]  # seq_len 256: write_run's data has no seq_len
    assert by_run["base~2x/seed0"].flops == per_token * 80 * 100  # write_run: 100 tokens a step
    assert by_run["mqa/seed0"].flops < by_run["base/seed0"].flops  # fewer kv heads: fewer FLOPs at equal tokens
    const = by_run["const~2x/seed0"]
    assert not const.main and not const.counts and const.why == "schedule.name=constant: the lr never decays"
    assert by_run["base/seed0"].main and not by_run["base~2x/seed0"].main


def test_a_point_short_of_its_end_is_left_out(tmp_path):
    root = tmp_path / "points"
    parent, main = compute_points(BASE, "base", budgets=(1, 2))
    _write(root, main, 0, 3.3)
    _write(root, parent, 0, 3.0, finished=False)
    split = split_budgets(load_runs(root)[0], [])
    point = next(p for p in split.points if p.run == "base~2x/seed0")
    assert point.arm == "base" and point.rung == () and not point.counts
    assert point.why.startswith("unfinished at step 80")


def test_a_rung_without_one_marked_main_budget_is_left_whole(tmp_path):
    root = tmp_path / "points"
    _write(root, variant(BASE, "short"), 0, 3.3)  # "train longer" as an ablation: no compute point
    _write(root, variant(BASE, "long", {"train.max_steps": 80}), 0, 3.0)
    split = split_budgets(load_runs(root)[0], [])
    assert [r.variant for r in split.main] == ["long", "short"] and split.extra == [] and split.points == []
    assert split.notes == [
        "rung []: no compute points read: budgets [(40, 0), (80, 0)] are each shared by every "
        "arm, none marked as the compute points"
    ]


def test_two_names_of_one_config_are_two_arms(tmp_path):
    """An A/A pair (equal configs, two names) at several budgets: each name keeps its own points."""
    root = tmp_path / "points"
    for name in ("a", "b"):
        for run in compute_points(BASE, name, budgets=(1, 2)):
            _write(root, run, 0, 3.3 if run.name == name else 3.0)
    split = split_budgets(load_runs(root)[0], [])
    assert sorted(r.variant for r in split.main) == ["a", "b"]
    assert {p.run: p.arm for p in split.points} == {
        "a/seed0": "a",
        "a~2x/seed0": "a",
        "b/seed0": "b",
        "b~2x/seed0": "b",
    }
