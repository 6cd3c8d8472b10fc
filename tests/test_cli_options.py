"""Every option of `run`, `plan`, `status`, `eval`, `export` and `report` with negative, zero, huge, wrong-type and
empty values: each is accepted with its documented meaning, or refused in one line naming the option (exit 2) before
any compute, with nothing written. `eval` and `export` print only their own lines (no torchao, no warnings)."""

import json
import shlex

import pytest
import torch

from conftest import TINY, cli_in_process, run_cli

GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny run: runs/tiny/mha/seed0."""
    root = tmp_path_factory.mktemp("trained")
    cli_in_process("run", str(TINY), "--only", "mha", "--out", str(root / "runs"))
    return root / "runs" / "tiny" / "mha" / "seed0"


@pytest.fixture
def paths(tmp_path, trained):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    full = tmp_path / "full"
    full.mkdir()
    for name in ("config.json", "a.txt", "b.txt", "c.txt", "d.txt", "e.txt"):
        (full / name).write_text("mine")
    return {
        "exp": str(TINY),
        "run": str(trained),
        "runs": str(trained.parent.parent),
        "tmp": str(tmp_path),
        "file": str(a_file),
        "full": str(full),
    }


def call(template: str, paths: dict):
    """The command line `template` with `paths` filled in, run in this process: returncode, stdout, stderr."""
    return cli_in_process(*[arg.format(**paths) for arg in shlex.split(template)], check=False)


def files_under(*roots) -> dict:
    return {p: p.stat().st_mtime_ns for root in roots for p in root.rglob("*")}


# (command line, what the one line must name). Each base command is complete, so a value that were accepted would
# go on and (quickly) do something; argparse takes the last of a repeated option, so the case's value wins.
RUN = "run {exp} --out {tmp}/runs"
PLAN = "plan {exp} --out {tmp}/runs"
EVAL = "eval {run} --tasks copa --limit 2"
EXPORT = "export {run} --hf {tmp}/hf"
REPORT = "report {runs} --out {tmp}/report"
REFUSED = [
    *[(f"{RUN} --only {v}", "--only") for v in ("''", ",", "nope")],
    *[(f"{RUN} --seeds {v}", "--seeds") for v in ("''", "a", "1.5", "0,0", "0,,x")],
    (f"{RUN} --seeds -1", "--seeds -1: got [-1]; allowed: a non-empty list of ints >= 0"),
    *[(f"{RUN} --set {v}", "--set") for v in ("''", "foo", "=3")],
    (f"{RUN} --set train.max_steps=abc", "train.max_steps"),
    *[
        (f"{RUN} --{o} {v}", f"--{o}")
        for o in ("jobs", "runs-per-gpu", "gpus-per-run")
        for v in ("0", "-1", "''", "a", "2.5")
        if (o, v) != ("gpus-per-run", "0")  # --gpus-per-run 0: CPU runs, allowed
    ],
    *(
        []
        if GPU
        else [
            (f"{RUN} --{o} 1000000000", "--runs-per-gpu / --gpus-per-run: no CUDA GPU")
            for o in ("runs-per-gpu", "gpus-per-run")
        ]
    ),
    *[(f"{RUN} --device-memory {v}", "--device-memory") for v in ("''", "abc", "-1", "0", "0GiB", "1.2.3", "8XB")],
    *[(f"{RUN} --launcher {v}", "--launcher") for v in ("''", "x", "SLURM")],
    *[
        (f"{RUN} --launcher local --slurm {v}", "--slurm")
        for v in ("''", "colour=blue", "time=-1", "time=abc", "nodes=2", "time")
    ],
    (f"{RUN} --slurm time=5", "--slurm: only with --launcher"),
    *[(f"{RUN} --out {v}", "--out") for v in ("''", "{file}/runs")],
    (f"{RUN} --out {{file}}", "--out {file}: is a file; allowed: a folder"),
    ("run '' --out {tmp}/runs", "file ''"),
    *[(f"{PLAN} --world-size {v}", "--world-size") for v in ("0", "-1", "''", "two", "1.5")],
    *[(f"{PLAN} --world-size {v}", "world size") for v in ("3", "1000000000000")],  # not a divisor of the batch
    *[(f"{PLAN} --dtype {v}", "--dtype") for v in ("''", "x", "FP32")],
    *[(f"{PLAN} --out {v}", "--out") for v in ("''", "{file}")],
    (f"{PLAN} --only ''", "--only"),
    (f"{PLAN} --seeds x", "--seeds"),
    (f"{PLAN} --set x", "--set"),
    (f"{PLAN} --device-memory 0", "--device-memory"),
    *[(f"status {{runs}} --watch {v}", "--watch") for v in ("0", "-1", "nan", "inf", "86401", "1e9", "''", "soon")],
    ("status ''", "runs_dir ''"),
    *[(f"{EVAL} --limit {v}", "--limit") for v in ("-5", "-1", "''", "a", "1.5")],
    *[(f"{EVAL} --tasks {v}", "--tasks") for v in ("''", ",", "nope")],
    *[(f"{EVAL} --format {v}", "--format") for v in ("''", "x", "CF")],
    *[(f"{EVAL} --batch-size {v}", "--batch-size") for v in ("0", "-1", "''", "a")],
    *[(f"{EVAL} --device {v}", "--device") for v in ("''", "x", "cuda:x", "gpu") + (() if GPU else ("cuda",))],
    *[(f"{EVAL} --dtype {v}", "--dtype") for v in ("''", "x", "fp16")],
    *[(f"{EVAL} --log-samples {v}", "--log-samples") for v in ("''", "{tmp}", "{file}/x", "{tmp}/no/such/x")],
    ("eval '' --tasks copa", "required"),
    *[(f"{EXPORT} --hf {v}", "--hf") for v in ("''", "{file}", "{file}/hf")],
    (
        f"{EXPORT} --hf {{full}}",
        "--hf {full}: not empty (6 entries: a.txt, b.txt, c.txt, config.json, d.txt and 1 more)",
    ),
    (f"{EXPORT} --hf {{run}} --force", "--hf {run}: the run folder"),
    (f"{EXPORT} --hf {{run}}/checkpoints/hf --force", "--hf"),
    ("export '' --hf {tmp}/hf", "checkpoint ''"),
    *[
        (f"{REPORT} --{o} {v}", f"--{o}")
        for o in ("alpha", "power", "early-fraction")
        for v in ("0", "1", "-0.5", "nan", "inf", "''", "x")
    ],
    *[(f"{REPORT} --min-shared-items {v}", "--min-shared-items") for v in ("0", "1.5", "nan", "''")],
    *[(f"{REPORT} --{o} {v}", f"--{o}") for o in ("min-monotonicity", "min-tau") for v in ("-1.5", "2", "nan", "''")],
    *[(f"{REPORT} --{o} {v}", f"--{o}") for o in ("min-z", "min-snr") for v in ("-1", "nan", "inf", "''", "x")],
    *[(f"{REPORT} --min-seeds {v}", "--min-seeds") for v in ("1", "0", "-1", "''", "2.5")],
    *[(f"{REPORT} --last-k {v}", "--last-k") for v in ("1", "0", "-3", "''")],
    *[(f"{REPORT} --bootstrap {v}", "--bootstrap") for v in ("99", "0", "1000001", "1000000000000", "''")],
    *[(f"{REPORT} --scale {v}", "--scale") for v in ("''", ",", "model.nope")],
    *[(f"{REPORT} --out {v}", "--out") for v in ("''", "{file}")],
    ("report ''", "runs_dir ''"),
]


@pytest.mark.parametrize("template, names", REFUSED, ids=[t for t, _ in REFUSED])
def test_a_wrong_value_is_refused_in_one_line_with_nothing_written(template, names, paths, tmp_path, trained):
    before = files_under(tmp_path, trained.parent.parent)
    result = call(template, paths)
    out, err = result.stdout, result.stderr
    assert result.returncode == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("ablate: error: ") and names.format(**paths) in err, err
    assert files_under(tmp_path, trained.parent.parent) == before


def test_help_still_prints_the_usage():
    result = call("eval --help", {})
    assert result.returncode == 0 and "usage: ablate eval" in result.stdout


# ---------------------------------------------------------------------------------------------------------------
# accepted values, with their documented meaning


def test_accepted_run_values_pass_the_checks(paths, tmp_path):
    """A huge --jobs (at most one run per job is used), a large --device-memory, a glob, new seeds: the command goes
    on to load the experiment, where the bad --set stops it."""
    result = call(
        f"{RUN} --jobs 1000000000 --device-memory 1000TiB --only 'm?a' --seeds 7,8 --set train.max_steps=abc", paths
    )
    err = result.stderr
    assert result.returncode == 2 and "train.max_steps: cannot read 'abc'" in err and "--jobs" not in err
    assert not (tmp_path / "runs").exists()


def test_accepted_plan_values_have_their_meaning(paths, tmp_path):
    result = call(
        "plan {exp} --world-size 2 --dtype bf16 --seeds 3,4 --device-memory 1000TiB --out {tmp}/missing --only mha",
        paths,
    )
    out = result.stdout
    assert result.returncode == 0, result.stderr
    assert "compute over 2 devices" in out and "FSDP2 over 2 ranks" in out and "bf16" in out
    assert out.splitlines()[2].split()[:2] == ["mha", "2"]  # two seeds
    assert not (tmp_path / "missing").exists()  # plan only reads the runs root


def test_status_watch_returns_once_nothing_runs(paths):
    result = call("status {runs} --watch 0.01", paths)
    assert result.returncode == 0 and "1 runs: 1 finished" in result.stdout


def _copa_row(out: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.startswith("copa "))


def test_limit_zero_is_every_item_and_a_huge_limit_the_same(paths):
    from ablate.eval.suite import all_tasks

    every = len(all_tasks()["copa"].rows())
    for limit, n in (("3", 3), ("0", every), ("1000000000000", every)):
        result = call(f"eval {{run}} --tasks copa --limit {limit} --batch-size 1000000000 --no-write", paths)
        assert result.returncode == 0 and _copa_row(result.stdout)[2] == str(n)


def test_accepted_report_thresholds_reach_the_report(paths, tmp_path):
    result = call(
        f"{REPORT} --min-z 0 --min-snr 0 --last-k 1000000 --bootstrap 100 --min-monotonicity -1 "
        "--min-tau 1 --early-fraction 0.5 --min-shared-items 1",
        paths,
    )
    assert result.returncode == 0, result.stderr
    options = json.loads((tmp_path / "report" / "report.json").read_text())["options"]
    assert {
        k: options[k]
        for k in (
            "min_z",
            "min_snr",
            "last_k",
            "bootstrap",
            "min_monotonicity",
            "min_tau",
            "early_fraction",
            "min_shared_items",
        )
    } == {
        "min_z": 0,
        "min_snr": 0,
        "last_k": 1000000,
        "bootstrap": 100,
        "min_monotonicity": -1,
        "min_tau": 1,
        "early_fraction": 0.5,
        "min_shared_items": 1,
    }


# ---------------------------------------------------------------------------------------------------------------
# eval and export print only their own lines, and the export is a model transformers reads with the same logits


@pytest.mark.slow
def test_eval_and_export_print_only_their_own_lines(trained, paths, tmp_path):
    """In fresh processes, as a user runs them; the export goes into a folder of the user's files with --force."""
    evaluated = run_cli("eval", str(trained), "--tasks", "copa", "--limit", "4", "--no-write")
    exported = run_cli("export", str(trained), "--hf", paths["full"], "--force")
    for result in (evaluated, exported):
        assert result.stderr == "", result.stderr  # no torchao "Failed to load", no warnings
    assert evaluated.stdout.startswith(f"{trained}/checkpoints/step_8 (step 8, ")
    assert exported.stdout.splitlines() == [
        f"wrote a transformers model to {paths['full']}",
        "--force: replaced 1 existing file(s): config.json",
        "--force: left 5 other entries as they were: a.txt, b.txt, c.txt, d.txt, e.txt",
    ]
    assert (tmp_path / "full" / "a.txt").read_text() == "mine"
    from transformers import AutoModelForCausalLM

    from ablate.eval.load import load_model

    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "full", dtype=torch.float32).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    ours = load_model(trained).model
    tokens = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, ours(tokens), atol=1e-4, rtol=1e-4)


def test_an_untied_qk_norm_model_is_written_as_qwen3(tmp_path):
    from transformers import AutoModelForCausalLM

    from ablate.config import ModelConfig
    from ablate.eval.export import write_model
    from ablate.model import Transformer

    model = Transformer(
        ModelConfig(
            vocab_size=300, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, qk_norm=True, tie_embeddings=False
        ),
        max_seq_len=32,
    )
    model.init_weights(torch.Generator().manual_seed(0))
    assert write_model(model.eval(), 32, 0, tmp_path) == ["config.json", "generation_config.json", "model.safetensors"]
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    tokens = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=tokens).logits, model(tokens), atol=1e-4, rtol=1e-4)
