"""`ablate run --stack K` and training.run.train_stack: runs of one shape trained as one stacked model, each run
still its own run folder, its curves, report, resume and failures those of the same runs trained one by one."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, TINY, run_cli

from ablate import rundir
from ablate.training.callbacks.metrics import MACHINE_FIGURES

SEEDS = "0,1,2"


def _rows(run_dir) -> list[tuple]:
    """Every logged (step, loss, grad_norm, val/loss) of a run, in order."""
    lines = rundir.read_jsonl(run_dir / rundir.METRICS)
    return [
        (r["step"], r.get("loss"), r.get("grad_norm"), r.get("val/loss"))
        for r in lines
        if "loss" in r or "val/loss" in r
    ]


def _close(a, b, rtol: float = 1e-5, atol: float = 1e-9) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
    return a == b


# what depends on the clock or the folder, not on the runs' numbers
VOLATILE = {
    "wall_seconds",
    "total_wall_seconds",
    "seconds",
    "runs_dir",
    "tokens_per_second",
    "mfu",
    "generated",
    "created",
}


def _differences(a, b, path="") -> list[str]:
    """Where two report.json trees differ beyond 1e-5 relative or 1e-6 absolute (a difference of losses near 0,
    an interval's end, carries the losses' relative error at their own scale); the volatile keys left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a if k not in VOLATILE for d in _differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return [] if _close(float(a), float(b), atol=1e-6) else [f"{path}: {a} vs {b}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@pytest.mark.slow
def test_a_stacked_study_equals_the_same_study_trained_run_by_run(tmp_path):
    """The tiny experiment's two variants x 3 seeds, `--stack 3` against one run at a time: each run's folder holds
    an ordinary run (the same identity in config.json, summary.json, status finished) whose every logged loss, grad
    norm and validation loss equals the lone run's (mha bit for bit; mqa's single key-value head rounds differently
    under vmap, within 1e-5), and `ablate report` gives the same report.json (within 1e-5 relative, 1e-6 absolute:
    mqa's last bits move an interval's end by ~2e-7)."""
    stacked = run_cli("run", str(TINY), "--seeds", SEEDS, "--stack", "3", "--out", str(tmp_path / "stacked"))
    run_cli("run", str(TINY), "--seeds", SEEDS, "--out", str(tmp_path / "alone"))
    assert "6 runs in 2 stacks of at most 3" in stacked.stdout
    assert "stack of 3: mha seed0, mha seed1, mha seed2" in stacked.stdout
    for variant in ("mha", "mqa"):
        for seed in range(3):
            one, other = (tmp_path / side / "tiny" / variant / f"seed{seed}" for side in ("stacked", "alone"))
            config, lone_config = (rundir.read_json(d / rundir.CONFIG) for d in (one, other))
            assert config["identity"] == lone_config["identity"]
            assert rundir.read_status(one)["state"] == "finished"
            assert rundir.read_json(one / rundir.SUMMARY)["stack"] == {"members": 3, "member": seed}
            got, want = _rows(one), _rows(other)
            assert len(got) == len(want) == 10  # 8 steps, 2 validations
            if variant == "mha":
                assert got == want
            else:
                assert all(_close(x, y) for g, w in zip(got, want) for x, y in zip(g, w)), (got, want)
    for side in ("stacked", "alone"):
        run_cli("report", str(tmp_path / side / "tiny"))
    reports = [json.loads((tmp_path / side / "tiny" / "report.json").read_text()) for side in ("stacked", "alone")]
    for report in reports:  # every logged key is in report.json; the machine's figures are the stack's, not a run's
        for group in report["groups"]:
            group["logged"] = [c for c in group["logged"] if c["key"] not in MACHINE_FIGURES]
    assert not _differences(*reports)


def _start_killable(args, out):
    return subprocess.Popen(
        [sys.executable, "-m", "ablate", *args, "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.slow
def test_a_stack_killed_9_resumes_from_its_members_checkpoints_even_at_different_steps(tmp_path):
    """A stack of 3 killed with SIGKILL once its last member has written its step-10 checkpoint; then member 0's
    newest checkpoint removed, as if the kill had come between the members' saves. The same command again resumes
    each member from its own newest checkpoint (member 0 from an older one, or none: it catches up alone, then
    rejoins the stack), and every member's curve equals that of a stack never stopped: every step once, bit for
    bit."""
    args = ["run", str(TINY), "--only", "mha", "--seeds", SEEDS, "--stack", "3"]
    args += ["--set", "train.max_steps=30", "--set", "train.ckpt_every=10"]
    run_cli(*args, "--out", str(tmp_path / "straight"))
    killed = tmp_path / "killed" / "tiny" / "mha"
    proc = _start_killable(args, tmp_path / "killed")
    deadline = time.time() + 240
    while not (killed / "seed2" / "checkpoints" / "step_10" / "meta.json").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-3000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not any((killed / f"seed{s}" / rundir.SUMMARY).exists() for s in range(3)), "ended before the kill"
    newest = rundir.checkpoint_steps(killed / "seed0")[-1]
    shutil.rmtree(rundir.checkpoint_root(killed / "seed0") / rundir.step_dir_name(newest))
    resumed = run_cli(*args, "--out", str(tmp_path / "killed"))
    assert "resumed from" in resumed.stdout and "3 runs: 3 finished" in resumed.stdout
    for seed in range(3):
        got, want = _rows(killed / f"seed{seed}"), _rows(tmp_path / "straight" / "tiny" / "mha" / f"seed{seed}")
        assert got == want
        assert [r[0] for r in got if r[1] is not None] == list(range(1, 31))


def test_a_member_that_diverges_is_recorded_as_diverged_and_the_others_finish(tmp_path):
    """train_stack with a callback that stops seed 1 at step 2: seed 1's folder says diverged (its status, step
    and reason, no summary), its result is RunDiverged; seeds 0 and 2 finish, their curves those of lone runs."""
    from ablate.setup.experiment import load_checked
    from ablate.training.callbacks import Callback
    from ablate.training.callbacks.base import TAKE, Verdict
    from ablate.training.run import train_stack

    class StopSeed1(Callback):
        name = "stop_seed1"

        def before_update(self, trainer):
            stop = trainer.run_dir.name == "seed1" and trainer.step == 2
            return Verdict("stop", "planted in the test") if stop else TAKE

    runs = load_checked(TINY, only="mha", seeds=[0, 1, 2])
    results = train_stack(runs, tmp_path / "stacked", [StopSeed1()])
    assert isinstance(results[1], rundir.RunDiverged)
    assert [r["steps"] for r in (results[0], results[2])] == [8, 8]
    folder = tmp_path / "stacked" / "tiny" / "mha"
    status = rundir.read_status(folder / "seed1")
    assert status["state"] == "diverged" and status["step"] == 2 and "planted" in status["message"]
    assert not (folder / "seed1" / rundir.SUMMARY).exists()
    alone = load_checked(TINY, only="mha", seeds=[0, 2])
    from ablate.training.run import train

    for run in alone:
        train(run, tmp_path / "alone")
    for seed in (0, 2):
        assert _rows(folder / f"seed{seed}") == _rows(tmp_path / "alone" / "tiny" / "mha" / f"seed{seed}")


def test_a_finished_run_is_only_read_and_a_stack_of_the_rest_trains(tmp_path):
    """Runs found finished are not trained again (their folders untouched); the others train as a stack."""
    run_cli("run", str(TINY), "--only", "mha", "--seeds", "0", "--out", str(tmp_path))
    summary = (tmp_path / "tiny" / "mha" / "seed0" / rundir.SUMMARY).read_bytes()
    again = run_cli("run", str(TINY), "--only", "mha", "--seeds", SEEDS, "--stack", "3", "--out", str(tmp_path))
    assert "already finished" in again.stdout and "stack of 2: mha seed1, mha seed2" in again.stdout
    assert (tmp_path / "tiny" / "mha" / "seed0" / rundir.SUMMARY).read_bytes() == summary


def test_the_files_stack_field_is_the_default_and_is_checked(tmp_path):
    """`stack = 2` in an experiment file stacks its runs without the flag; --stack overrides it; a bad value is
    refused before any compute, naming the file, the field and what is allowed."""
    text = TINY.read_text()
    good, bad = tmp_path / "stacked.py", tmp_path / "bad.py"
    good.write_text(text + "seeds = [0, 1]\nstack = 2\n")
    bad.write_text(text + "stack = 0\n")
    out = run_cli("run", str(good), "--only", "mha", "--out", str(tmp_path / "runs"))
    assert "2 runs in 1 stacks of at most 2" in out.stdout
    refused = run_cli("run", str(bad), "--out", str(tmp_path / "runs"), check=False)
    assert (
        refused.returncode != 0 and f"{bad}" in refused.stderr and "stack is 0; allowed: an int >= 1" in refused.stderr
    )


def test_runs_a_stack_cannot_hold_train_alone_and_the_plan_says_why():
    """A branch, Triton kernels, float8 and dropout never enter a stack; runs that differ in shape, or in
    train.cuda_graphs, are never stacked together; runs that differ in values (seed, learning rate, init scale)
    are."""
    import dataclasses

    from ablate.setup.experiment import load_checked
    from ablate.training.stack import plan_stacks

    runs = load_checked(TINY, seeds=[0, 1])  # mha x 2 seeds, mqa x 2 seeds
    lr = dataclasses.replace(
        runs[1], config=dataclasses.replace(runs[1].config, optim=dataclasses.replace(runs[1].config.optim, lr=1e-2))
    )
    stacks, alone = plan_stacks([runs[0], lr, runs[2], runs[3]], 4)
    assert [[r.config.name for r in s] for s in stacks] == [["mha", "mha"], ["mqa", "mqa"]] and alone == []
    dropout = runs[0].config.model.__class__(**{**dataclasses.asdict(runs[0].config.model), "dropout": 0.1})
    with_dropout = dataclasses.replace(runs[0], config=dataclasses.replace(runs[0].config, model=dropout))
    stacks, alone = plan_stacks([with_dropout, runs[1]], 4)
    assert len(stacks) == 2 and any("dropout" in line for line in alone)
    graphed = dataclasses.replace(
        runs[0],
        config=dataclasses.replace(runs[0].config, train=dataclasses.replace(runs[0].config.train, cuda_graphs=True)),
    )
    stacks, alone = plan_stacks([graphed, runs[1]], 4)
    assert len(stacks) == 2 and all("no other run shares its shape" in line for line in alone)
    graphed_too = dataclasses.replace(
        runs[1],
        config=dataclasses.replace(runs[1].config, train=dataclasses.replace(runs[1].config.train, cuda_graphs=True)),
    )
    assert len(plan_stacks([graphed, graphed_too], 4)[0]) == 1


def test_a_member_rolled_back_by_its_spike_policy_catches_up_alone_and_rejoins(tmp_path):
    """A callback rolls seed 1 back once, at step 6, to its step-4 checkpoint (the others go on at step 6): seed 1
    takes steps 5-6 again alone, then the three step as one stack again. Every member's curve equals its lone run's
    under the same callback, and seed 1's summary records the rollback."""
    from ablate.setup.experiment import load_checked
    from ablate.training.callbacks import Callback
    from ablate.training.callbacks.base import TAKE, Verdict
    from ablate.training.run import train, train_stack

    class RollBackSeed1Once(Callback):
        name = "roll_back_seed1_once"

        def __init__(self):
            self.fired = False

        def before_update(self, trainer):
            if trainer.run_dir.name == "seed1" and trainer.step == 6 and not self.fired:
                self.fired = True
                return Verdict("rollback", "planted in the test")
            return TAKE

    runs = load_checked(TINY, only="mha", seeds=[0, 1, 2], overrides={"train.max_steps": "10"})
    results = train_stack(runs, tmp_path / "stacked", [RollBackSeed1Once()])
    assert [r["steps"] for r in results] == [10, 10, 10]
    assert [(r["from_step"], r["to_step"]) for r in results[1]["rollbacks"]] == [(6, 4)]
    for run in runs:
        train(run, tmp_path / "alone", [RollBackSeed1Once()])
    for seed in range(3):
        stacked, alone = (tmp_path / side / "tiny" / "mha" / f"seed{seed}" for side in ("stacked", "alone"))
        assert _rows(stacked) == _rows(alone)


@pytest.mark.slow
def test_stacks_side_by_side_in_worker_processes(tmp_path):
    """`--stack 2 --jobs 2`: the tiny experiment's two variants x 2 seeds as two stacks, each in its own worker
    process at once; every run an ordinary finished run of its stack, its curve the lone run's."""
    args = ["run", str(TINY), "--seeds", "0,1", "--out"]
    both = run_cli(*args, str(tmp_path / "stacked"), "--stack", "2", "--jobs", "2")
    assert "2 stacks, 2 at a time" in both.stdout and "4 runs: 4 finished" in both.stdout
    run_cli(*args, str(tmp_path / "alone"), "--only", "mha")
    for seed in range(2):
        stacked = tmp_path / "stacked" / "tiny" / "mha" / f"seed{seed}"
        assert rundir.read_json(stacked / rundir.SUMMARY)["stack"] == {"members": 2, "member": seed}
        assert _rows(stacked) == _rows(tmp_path / "alone" / "tiny" / "mha" / f"seed{seed}")
    assert rundir.read_json(tmp_path / "stacked" / "tiny" / "mqa" / "seed1" / rundir.SUMMARY)["stack"]["members"] == 2
