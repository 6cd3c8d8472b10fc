import textwrap

import pytest

from ablate.setup.experiment import ExperimentError, load_experiment
from conftest import TINY, cli_in_process


def write(tmp_path, body: str):
    path = tmp_path / "exp.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_loads_variants_and_seeds():
    runs = load_experiment(TINY, seeds=[0, 1], overrides={"train.max_steps": "3"})
    assert [(r.name, r.train.seed) for r in runs] == [("mha", 0), ("mha", 1), ("mqa", 0), ("mqa", 1)]
    assert all(r.train.max_steps == 3 and r.experiment == "tiny" for r in runs)
    assert [r.name for r in load_experiment(TINY, only=["mqa"])] == ["mqa"]


def test_experiment_name_defaults_to_file_stem(tmp_path):
    path = write(
        tmp_path,
        """
        from ablate import RunConfig
        runs = [RunConfig(name="a")]
    """,
    )
    assert load_experiment(path)[0].experiment == "exp"


@pytest.mark.parametrize(
    "body, expected",
    [
        ("runs = [\n", r"exp.py:\d+: syntax error"),
        (
            "from ablate import RunConfig, ModelConfig\nruns = [RunConfig(model=ModelConfig(n_layer=2))]\n",
            r"exp.py:2: ModelConfig: unknown field 'n_layer'; allowed: .*n_layers",
        ),
        (
            "from ablate import RunConfig, ModelConfig\nruns = [RunConfig(model=ModelConfig(n_layers='2'))]\n",
            r"variant 'base': model.n_layers: got '2' \(str\); allowed: int",
        ),
        (
            "from ablate import RunConfig, ModelConfig\nruns = [RunConfig(model=ModelConfig(d_model=100, "
            "n_heads=3))]\n",
            r"model.n_heads: 3 does not divide model.d_model=100",
        ),
        (
            "from ablate import RunConfig, DataConfig\nruns = [RunConfig(data=DataConfig(source='/nope/x.jsonl'))]\n",
            r"data.source",
        ),
        (
            "from ablate import RunConfig, variant\nruns = [variant(RunConfig(), 'g', {'model.n_kv_heads': 3})]\n",
            r"exp.py:2: ConfigError: model.n_kv_heads: 3 does not divide",
        ),
        ("runs = 3\n", r"must define `runs`"),
        ("from ablate import RunConfig\nruns = [RunConfig(), RunConfig()]\n", r"repeated: \['base'\]"),
    ],
)
def test_bad_files_fail_with_one_clear_message(tmp_path, body, expected):
    with pytest.raises(ExperimentError, match=expected):
        load_experiment(write(tmp_path, body))


def test_bad_cli_choices():
    with pytest.raises(ExperimentError, match=r"--only gqa: no such variant .* allowed: \['mha', 'mqa'\]"):
        load_experiment(TINY, only=["gqa"])
    with pytest.raises(ExperimentError, match="model.ffn: 'mish' unknown; allowed: swiglu, gelu, relu, moe"):
        load_experiment(TINY, overrides={"model.ffn": "mish"})


def test_cli_reports_error_before_compute(tmp_path):
    result = cli_in_process("run", str(TINY), "--out", str(tmp_path), "--set", "model.n_heads=3", check=False)
    assert result.returncode == 2
    assert "model.n_heads: 3 does not divide model.d_model=32" in result.stderr
    assert not any(tmp_path.iterdir())  # nothing was created: no compute started


def test_registered_names_are_checked_for_the_runs_that_train(tmp_path):
    """optim.name and eval.tasks are checked once per chosen run: a file with branches reads every variant (a
    chosen branch needs its parent's identity), but a bad name in a variant that will not train stops nothing."""
    path = write(
        tmp_path,
        """
        from ablate import RunConfig, branch, variant
        stable = variant(RunConfig(), "stable")
        runs = [stable, branch(stable, 0.5, "cool"), variant(RunConfig(), "lion", {"optim.name": "lion"})]
    """,
    )
    assert [(r.name, r.branch["step"]) for r in load_experiment(path, only=["cool"])] == [("cool", 100)]
    with pytest.raises(ExperimentError, match=r"exp.py: variant 'lion': optim.name: 'lion' unknown; allowed: adamw"):
        load_experiment(path)


def test_an_experiment_file_executes_once_per_process(tmp_path):
    """Its runs, seeds, decision rule and callbacks come from one execution (a command asked for each in turn used
    to execute it again each time); a changed file is executed anew."""
    from ablate.setup.experiment import experiment_callbacks, experiment_study, load_checked

    counter = tmp_path / "executions.txt"
    body = f"""
        from pathlib import Path
        from ablate import RunConfig
        _count = Path({str(counter)!r})
        _count.write_text(_count.read_text() + "x" if _count.exists() else "x")
        runs = [RunConfig(name="a")]
        seeds = [0, 1]
    """
    path = write(tmp_path, body)
    checked = load_checked(path)
    assert [r.config.train.seed for r in checked] == [0, 1] and all(r.world == 1 for r in checked)
    assert checked[0].batch_plan and checked[0].config == load_experiment(path)[0]
    assert experiment_study(path) == (None, [0, 1]) and experiment_callbacks(path) == []
    assert counter.read_text() == "x"
    path.write_text(path.read_text() + "\nseeds = [3]\n")
    assert [r.train.seed for r in load_experiment(path)] == [3] and counter.read_text() == "xx"


def test_a_checked_run_is_checked_again_only_for_another_world(monkeypatch):
    """train() takes a CheckedRun as it is for the world it was checked for; for another world (a torchrun group
    of 3) only what depends on the world is checked again: not its data files."""
    import ablate.setup.checks as checks
    from ablate.config import ConfigError
    from ablate.setup.experiment import load_checked

    checked = load_checked(TINY, only=["mha"])[0]  # global_batch 8
    assert checks.check_run(checked) is checked and checks.check_run(checked, 1) is checked

    def refuse(*args, **kwargs):
        raise AssertionError("its data config was checked already")

    monkeypatch.setattr(checks, "check_data_config", refuse)
    on_two = checks.check_run(checked, 2)
    assert on_two.world == 2 and on_two.config is checked.config and on_two.batch_plan == checked.batch_plan
    with pytest.raises(ConfigError, match="world"):
        checks.check_run(checked, 3)
    with pytest.raises(AssertionError, match="checked already"):
        checks.check_run(checked.config, 2)  # a RunConfig is checked whole


def test_the_quickstart_is_an_ablation_and_the_reference_a_single_run():
    """The README's first command trains an ablation with a question in it (3 variants x 3 seeds, each one change
    from the baseline, no in-run evals so that it ends in minutes); experiments/reference.py stays the single-run
    speed and regression reference (its model, data and evals as docs/performance.md measured them)."""
    from conftest import REPO

    runs = load_experiment(REPO / "experiments" / "quickstart.py")
    by_name = {(r.name, r.train.seed) for r in runs}
    assert by_name == {(v, s) for v in ("baseline", "low_lr", "qk_norm") for s in (0, 1, 2)}
    base = next(r for r in runs if r.name == "baseline")
    low = next(r for r in runs if r.name == "low_lr")
    assert low.optim.lr == pytest.approx(base.optim.lr / 10) and not base.model.qk_norm
    assert all(r.eval.tasks == "" for r in runs)
    assert base.train.max_steps * base.train.global_batch * base.data.seq_len == 204_800
    (reference,) = load_experiment(REPO / "experiments" / "reference.py")
    assert reference.name == "baseline" and reference.model.d_model == 128 and reference.train.max_steps == 250


def test_multiplier_baseline_is_checked_and_recorded_in_every_run(tmp_path):
    body = """
        from ablate import RunConfig, TrainConfig, compute_points, variant
        base = RunConfig(train=TrainConfig(max_steps=8))
        runs = compute_points(variant(base, "adamw@d64"), "adamw@d64") + [variant(base, "muon@d64")]
        multiplier_baseline = {name!r}
    """
    runs = load_experiment(write(tmp_path, body.format(name="adamw")))
    assert {r.multiplier_baseline for r in runs} == {"adamw"}
    assert runs[0].identity() == variant_identity(runs[0])  # bookkeeping: the identity does not change
    with pytest.raises(ExperimentError, match=r"exp.py:5: multiplier_baseline is 'sgd'; allowed: .*adamw, .*muon"):
        load_experiment(write(tmp_path, body.format(name="sgd")))


def variant_identity(run):
    import dataclasses

    return dataclasses.replace(run, multiplier_baseline="").identity()
