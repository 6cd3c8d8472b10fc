"""ablate.launch.slurm: option parsing, the sbatch script it asks for, and the code a cluster runs, run for real through
submitit's LocalExecutor (real processes, the same pickles, signals and requeue path, no cluster)."""

import dataclasses
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from ablate.config import ConfigError
from ablate.launch.slurm import (
    REQUEUES_FILE,
    RunTask,
    executor_parameters,
    launch,
    collect,
    parse_slurm_options,
    submit,
)
from ablate.setup.checks import check_run
from ablate.setup.experiment import load_checked, load_experiment
from conftest import TINY

submitit = pytest.importorskip("submitit")


def run_dir(out, run):
    return Path(out) / run.experiment / run.name / f"seed{run.train.seed}"


def test_options_typed_with_defaults():
    options = parse_slurm_options(
        "partition=gpu, time=60,gpus_per_run=2,cpus_per_run=16,mem_gb=64,qos=high,"
        "constraint=a100|h100,array_parallelism=4,folder=/tmp/logs"
    )
    assert options == {
        "partition": "gpu",
        "time": 60,
        "gpus_per_run": 2,
        "cpus_per_run": 16,
        "mem_gb": 64,
        "qos": "high",
        "constraint": "a100|h100",
        "array_parallelism": 4,
        "folder": "/tmp/logs",
        "nodes": 1,
        "max_requeues": 3,
    }
    assert parse_slurm_options("")["max_requeues"] == 3


@pytest.mark.parametrize(
    "text, named",
    [
        ("partition=gpu,gpu=2", "--slurm gpu: unknown option; allowed: partition, time, gpus_per_run"),
        ("time=1h", "--slurm time=1h: not a whole number"),
        ("time=0", "--slurm time=0: allowed: whole numbers >= 1"),
        ("gpus_per_run=-1", "--slurm gpus_per_run=-1: allowed: whole numbers >= 0"),
        ("max_requeues=x", "--slurm max_requeues=x: not a whole number"),
        ("partition=", "--slurm partition: needs a value"),
        ("time=5,time=6", "--slurm time: given twice"),
    ],
)
def test_bad_options_refused_by_name(text, named):
    with pytest.raises(ConfigError) as err:
        parse_slurm_options(text)
    assert named in str(err.value)


def test_several_nodes_not_implemented():
    with pytest.raises(NotImplementedError, match="nodes=2.*not supported yet"):
        parse_slurm_options("nodes=2")


def test_sbatch_script_asks_for_one_task_per_gpu(tmp_path):
    """The SLURM script submitit would write for a 2-run array (no cluster needed to build it)."""
    from submitit.slurm.slurm import _make_sbatch_string

    options = parse_slurm_options(
        "partition=gpu,time=90,gpus_per_run=4,cpus_per_run=32,mem_gb=200,account=lab,array_parallelism=1"
    )
    script = _make_sbatch_string(
        command="python -m submitit.core._submit x",
        folder=tmp_path,
        map_count=2,
        **executor_parameters(options, "ablate-tiny", local=False),
    )
    for line in (
        "--partition=gpu",
        "--time=90",
        "--gpus-per-node=4",
        "--ntasks-per-node=4",
        "--cpus-per-task=8",
        "--mem=200GB",
        "--account=lab",
        "--array=0-1%1",
        "--nodes=1",
        "--job-name=ablate-tiny",
        "--signal=USR2@90",
    ):
        assert f"#SBATCH {line}\n" in script, line


def test_cluster_needs_a_time_limit_and_slurm(tmp_path):
    runs = load_checked(TINY, only=["mha"])
    with pytest.raises(ConfigError, match="time=MINUTES: required"):
        submit(runs, str(tmp_path), parse_slurm_options("partition=gpu"))
    if not shutil.which("srun"):
        with pytest.raises(ConfigError, match="--slurm: .*srun"):
            submit(runs, str(tmp_path), parse_slurm_options("time=5"))


def test_requeues_are_counted_and_bounded(tmp_path, capsys):
    run = load_experiment(TINY, only=["mha"])[0]
    task = RunTask(max_requeues=2, threads=1)
    again = task.checkpoint(run.to_dict(), str(tmp_path), 1)
    assert again.function is task and again.args == (run.to_dict(), str(tmp_path), 2)
    assert (run_dir(tmp_path, run) / REQUEUES_FILE).read_text() == "2\n"
    assert task.checkpoint(run.to_dict(), str(tmp_path), 2) is None  # submitit then ends the task with an error
    assert "not requeued: already requeued 2 times (max_requeues=2)" in capsys.readouterr().out


@pytest.mark.slow
def test_local_array_end_to_end(tmp_path, capsys):
    runs = load_checked(TINY)
    assert submit(runs, str(tmp_path), {}, local=True) == ["finished", "finished"]
    for run in runs:
        assert (run_dir(tmp_path, run.config) / "summary.json").is_file()
    out = capsys.readouterr().out
    assert out.count("submitted job ") == 2 and "slurm: 2 finished, 0 failed, 0 diverged" in out


@pytest.mark.slow
def test_one_run_over_two_processes(tmp_path):
    """gpus_per_run=2: one task of 2 processes, joined through the torchrun variables RunTask exports (gloo on
    CPU here: submitit's LocalExecutor hands out GPU ids it does not check)."""
    run = load_experiment(TINY, only=["mha"])[0]
    assert submit([check_run(run)], str(tmp_path), {"gpus_per_run": 2}, local=True) == ["finished"]
    assert json.loads((run_dir(tmp_path, run) / "summary.json").read_text())["world_size"] == 2


@pytest.mark.slow
def test_crashed_task_counts_as_failed(tmp_path, capsys):
    """A task that dies outright (here: killed) never returns a state: it is counted failed, with its message."""
    run = load_experiment(TINY, only=["mha"], overrides={"train.max_steps": "1000"})[0]
    runs = [[check_run(run)]]  # one group: the run alone
    jobs = launch(runs, str(tmp_path), {}, local=True)
    jobs[0]._results_timeout_s = 0  # submitit waits 15 s for a result file a slow network disk may not show yet
    _wait_for_checkpoint(run_dir(tmp_path, run), jobs[0])
    for pid in _task_pids(jobs[0]):
        os.kill(pid, signal.SIGKILL)
    assert collect(jobs, runs, str(tmp_path)) == ["failed"]
    out = capsys.readouterr().out
    assert f"failed job {jobs[0].job_id}" in out and "slurm: 0 finished, 1 failed, 0 diverged" in out
    status = json.loads((run_dir(tmp_path, run) / "status.json").read_text())
    assert status["state"] == "failed" and f"job {jobs[0].job_id} ended without a result" in status["message"]


def _task_pids(job) -> list[int]:
    """The processes of a local job's tasks: the children of submitit's controller process (its job id)."""
    pid = int(job.job_id)
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _wait_for_checkpoint(path: Path, job) -> None:
    deadline = time.time() + 300  # a guard against hanging, not a timing assertion
    while not list((path / "checkpoints").glob("step_*")):
        assert not job.done() and time.time() < deadline, f"no checkpoint in {path}:\n{job.stdout()}{job.stderr()}"
        time.sleep(0.05)


def _train_rows(path: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in rows if "loss" in r]


@pytest.mark.slow
def test_preempted_task_is_requeued_and_resumes(tmp_path):
    """Interrupt a task mid-run with the signal SLURM sends before a time limit (and that submitit's local
    controller sends at its timeout): submitit calls RunTask.checkpoint, requeues, and the run resumes from its
    newest checkpoint to the same losses as an uninterrupted twin trained beside it."""
    run = load_experiment(TINY, only=["mha"], overrides={"train.max_steps": "200", "train.ckpt_every": "10"})[0]
    twin = dataclasses.replace(run, name="uninterrupted")
    runs = [[check_run(run)], [check_run(twin)]]  # two groups: each run alone
    jobs = launch(runs, str(tmp_path), {}, local=True)
    folder = run_dir(tmp_path, run)
    _wait_for_checkpoint(folder, jobs[0])
    for pid in _task_pids(jobs[0]):
        os.kill(pid, submitit.JobEnvironment._usr_sig())  # SIGUSR2
    assert collect(jobs, runs, str(tmp_path)) == ["finished", "finished"]

    assert (folder / REQUEUES_FILE).read_text() == "1\n"
    log = Path(json.loads((folder / "status.json").read_text())["log"]).read_text()  # the task's console log
    assert "requeued (1/3)" in log and "requeue 1/3 of mha seed0: resuming" in log
    assert f"resumed from {folder / 'checkpoints'}" in log
    rows = _train_rows(folder)
    assert [r[0] for r in rows] == list(range(1, 201))  # every step exactly once
    assert rows == _train_rows(run_dir(tmp_path, twin))
    assert json.loads((folder / "summary.json").read_text())["steps"] == 200


@pytest.mark.slow
def test_a_stack_is_one_task_whose_runs_equal_their_lone_runs(tmp_path):
    """--stack through submitit's local executor: three seeds as one task (a list of runs), each its own run
    folder, their curves those of the same runs trained alone; a preempted stack's task is requeued with every
    member's requeue count written."""
    runs = [check_run(r) for r in load_experiment(TINY, only=["mha"], seeds=[0, 1, 2])]
    out = tmp_path / "stacked"
    assert submit(runs, str(out), {}, local=True, stacks=[runs]) == ["finished"] * 3
    assert submit(runs, str(tmp_path / "alone"), {}, local=True) == ["finished"] * 3
    for run in runs:
        stacked = run_dir(out, run.config)
        assert json.loads((stacked / "summary.json").read_text())["stack"]["members"] == 3
        assert _train_rows(stacked) == _train_rows(run_dir(tmp_path / "alone", run.config))
    task = RunTask(max_requeues=2, threads=1)
    again = task.checkpoint([r.config.to_dict() for r in runs], str(out), requeues=0)
    assert again is not None and all((run_dir(out, r.config) / REQUEUES_FILE).read_text() == "1\n" for r in runs)
