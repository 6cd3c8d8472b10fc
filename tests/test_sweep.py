"""Run folders nothing corrupts, and sweeps: one writer per run, final diverged state, atomic files, torn JSONL
lines, failure isolation, --jobs N equal to serial, Ctrl-C, `ablate status`."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ablate import rundir
from ablate.launch.sweep import attempt, machine_slots
from ablate.setup.experiment import load_experiment
from ablate.setup.overrides import apply_overrides
from ablate.training.run import run_dir_for
from conftest import REPO, TINY, cli_in_process, run_cli


def tiny(steps=6, name="mha", **overrides):
    run = load_experiment(TINY, only=[name], overrides={"train.max_steps": str(steps)})[0]
    return apply_overrides(run, overrides) if overrides else run


def losses(run_dir):
    return [(r["step"], r["loss"]) for r in rundir.read_jsonl(run_dir / "metrics.jsonl") if "loss" in r]


HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from ablate.rundir import RunLock
    assert RunLock(sys.argv[1]).acquire()
    print("held", flush=True)
    time.sleep(120)
""")


def test_one_writer_per_run_and_a_dead_holders_lock_is_taken_over(tmp_path):
    run = tiny()
    run_dir = run_dir_for(tmp_path, run)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        state, message = attempt(run, tmp_path)
        assert state == "locked" and f"pid {holder.pid}" in message and "skipped" in message
        assert not (run_dir / "metrics.jsonl").exists()  # it did not train beside the holder
        assert rundir.RunLock(run_dir).held_by_live_process()
    finally:
        holder.kill()
        holder.wait()
    assert not rundir.RunLock(run_dir).held_by_live_process()
    assert attempt(run, tmp_path)[0] == "finished"  # the dead holder's lock is taken over
    assert [s for s, _ in losses(run_dir)] == list(range(1, 7))


@pytest.mark.slow
def test_two_overlapping_cli_runs_train_each_step_once(tmp_path):
    args = ["run", str(TINY), "--only", "mha", "--set", "train.max_steps=30", "--out", str(tmp_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "ablate", *args],
            cwd=REPO,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    text = "".join(out for out, _ in outputs)
    run_dir = tmp_path / "tiny" / "mha" / "seed0"
    assert [s for s, _ in losses(run_dir)] == list(range(1, 31))  # every step once, in order
    # either the second start found the lock held, or it found the run already finished
    assert "skipped, being trained by pid" in text or text.count("finished mha seed0") == 2


def test_diverged_is_final_recorded_and_reported_apart(tmp_path):
    from ablate.report import Options, write_report

    ok = tiny(steps=8)
    bad = apply_overrides(tiny(steps=40), {"name": "lr_1e4", "optim.lr": 1e4, "optim.grad_clip": 0.0})
    assert attempt(ok, tmp_path)[0] == "finished"
    state, message = attempt(bad, tmp_path)
    assert state == "diverged" and "non-finite" in message
    status = rundir.read_status(run_dir_for(tmp_path, bad))
    assert status["state"] == "diverged" and status["step"] < 40 and status["skipped_steps"] >= 5
    for _ in range(3):  # a requeue wrapper rerunning it never turns it into "finished"
        state, message = attempt(bad, tmp_path)
        assert state == "diverged" and "not retried" in message
    assert not (run_dir_for(tmp_path, bad) / "summary.json").exists()
    report = write_report(tmp_path / "tiny", tmp_path / "report", Options(bootstrap=50))
    assert report["overview"]["diverged"] == ["lr_1e4/seed0"]
    assert "diverged, listed apart" in report["headline"]["text"]
    assert "Diverged (a result" in (tmp_path / "report" / "report.md").read_text()


def test_json_files_are_atomic_and_read_errors_name_the_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    rundir.write_json_atomic(path, {"a": 1})

    def dies_midway(fd):  # the new text is in the temporary file, not yet renamed over the old
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir.os, "fsync", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        rundir.write_json_atomic(path, {"a": 2})
    monkeypatch.undo()
    assert rundir.read_json(path) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    path.write_text('{"a": ')
    with pytest.raises(rundir.RunFolderError, match=str(path)):
        rundir.read_json(path)


def test_a_truncated_summary_is_rebuilt_from_the_final_checkpoint(tmp_path):
    run = tiny(steps=4)
    assert attempt(run, tmp_path)[0] == "finished"
    run_dir = run_dir_for(tmp_path, run)
    good = rundir.read_json(run_dir / "summary.json")
    (run_dir / "summary.json").write_text('{"final_loss": 6.1')
    assert attempt(run, tmp_path)[0] == "finished"
    again = rundir.read_json(run_dir / "summary.json")
    assert again["final_loss"] == good["final_loss"] and again["steps"] == 4
    assert (run_dir / "summary.json.damaged").is_file()


def test_a_torn_jsonl_line_is_dropped_on_resume(tmp_path, capfd):
    run = tiny(steps=8, **{"train.ckpt_every": 4})
    straight = tmp_path / "straight"
    attempt(run, straight)
    attempt(run, tmp_path / "torn")
    run_dir = run_dir_for(tmp_path / "torn", run)
    # as if killed at step 6 while writing: checkpoint 8 gone, summary gone, half a line at the end
    import shutil

    shutil.rmtree(run_dir / "checkpoints" / "step_8")
    (run_dir / "summary.json").unlink()
    kept = [line for line in (run_dir / "metrics.jsonl").read_text().splitlines() if json.loads(line)["step"] <= 6]
    (run_dir / "metrics.jsonl").write_text("\n".join(kept) + '\n{"step": 7, "loss": 6.0')
    assert attempt(run, tmp_path / "torn")[0] == "finished"
    assert "dropped a torn last line" in capfd.readouterr().err
    assert losses(run_dir) == losses(run_dir_for(straight, run))
    with pytest.raises(rundir.RunFolderError, match=r"metrics.jsonl:2: not valid JSON"):
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "metrics.jsonl").write_text('{"step": 1}\n{"st\n{"step": 3}\n')
        rundir.read_jsonl(tmp_path / "bad" / "metrics.jsonl")


def test_a_run_failing_before_its_first_step_does_not_block_the_corrected_rerun(tmp_path):
    too_big = tiny(**{"train.global_batch": 4096, "train.micro_batch": 4})  # more than the data has
    state, message = attempt(too_big, tmp_path)
    assert state == "failed" and "train.global_batch" in message
    run_dir = run_dir_for(tmp_path, too_big)
    assert rundir.read_status(run_dir)["state"] == "failed"
    fixed = tiny()  # another identity in the same folder
    assert attempt(fixed, tmp_path)[0] == "finished"
    status = rundir.read_status(run_dir)
    assert status["state"] == "finished" and status["history"][0]["state"] == "failed"  # the failure stays on record


def write_experiment(path, variants: str):
    path.write_text(
        textwrap.dedent(f"""
        from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant
        base = RunConfig(experiment="iso", model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
                         data=DataConfig(source="default", max_documents=400, seq_len=32),
                         train=TrainConfig(max_steps=6, global_batch=8, micro_batch=4, log_every=1, val_every=3,
                                           ckpt_every=3, peak_flops=1e11))
        runs = [{variants}]
    """)
    )
    return path


def test_a_run_that_cannot_run_stops_the_sweep_before_any_compute(tmp_path):
    exp = write_experiment(
        tmp_path / "iso.py", 'variant(base, "ok"), variant(base, "huge", {"train.global_batch": 4096})'
    )
    result = cli_in_process("run", str(exp), "--out", str(tmp_path / "runs"), check=False)
    assert result.returncode == 2 and "train.global_batch=4096" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs" / "iso" / "ok" / "seed0" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_one_failing_run_never_stops_the_others(tmp_path):
    """--jobs 2: one worker dies (as by the OOM killer) while the other trains on; the death is recorded."""
    exp = write_experiment(
        tmp_path / "iso.py",
        'variant(base, "long", {"train.max_steps": 100000}), variant(base, "short", {"train.max_steps": 30})',
    )
    cmd = [sys.executable, "-m", "ablate", "run", str(exp), "--out", str(tmp_path / "runs"), "--jobs", "2"]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    long_dir = tmp_path / "runs" / "iso" / "long" / "seed0"
    deadline = time.time() + 200
    while not (long_dir / "checkpoints" / "step_3" / "meta.json").exists():
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    os.kill(rundir.read_status(long_dir)["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=200)
    assert proc.returncode == 1, out + err
    assert "failed long seed0: worker process ended (killed by signal 9)" in out
    assert "finished short seed0" in out and "2 runs: 1 finished, 1 failed" in out
    assert f"next: ablate status {tmp_path / 'runs'}/iso   ablate report {tmp_path / 'runs'}/iso" in out
    failed = rundir.read_status(long_dir)
    assert failed["state"] == "failed" and "killed by signal 9" in failed["message"]
    status = run_cli("status", str(tmp_path / "runs" / "iso")).stdout
    assert "long/seed0" in status and "failed" in status and "short/seed0" in status and "finished" in status
    assert "2 runs: 1 failed, 1 finished" in status and "log: " in status


@pytest.mark.slow
def test_jobs_2_gives_the_losses_of_serial_runs(tmp_path):
    args = ["run", str(TINY), "--set", "train.max_steps=8"]
    run_cli(*args, "--out", str(tmp_path / "serial"))  # OMP_NUM_THREADS=1: the thread count of --jobs 2
    side = run_cli(*args, "--out", str(tmp_path / "jobs"), "--jobs", "2")
    assert "2 runs, 2 at a time" in side.stdout and "2 runs: 2 finished" in side.stdout, side.stdout
    same_threads = (os.cpu_count() or 1) // 2 == 1
    for variant in ("mha", "mqa"):
        a = losses(tmp_path / "serial" / "tiny" / variant / "seed0")
        b = losses(tmp_path / "jobs" / "tiny" / variant / "seed0")
        assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, 9))
        if same_threads:
            assert a == b  # bit-identical
        else:
            assert max(abs(x - y) for (_, x), (_, y) in zip(a, b)) < 1e-5
        logs = list((tmp_path / "jobs" / "tiny" / variant / "seed0" / "logs").glob("*.log"))
        assert logs and "step 8/8" in logs[0].read_text()


@pytest.mark.slow
def test_ctrl_c_says_where_to_resume(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "ablate",
        "run",
        str(TINY),
        "--only",
        "mha",
        "--set",
        "train.max_steps=100000",
        "--set",
        "train.ckpt_every=5",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"},  # SIGABRT prints every thread
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    run_dir = tmp_path / "tiny" / "mha" / "seed0"
    deadline = time.time() + 200
    while not (run_dir / "checkpoints" / "step_10" / "meta.json").exists():
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # a hang after Ctrl-C: say where each thread stood
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=60)
        raise AssertionError(f"no exit 60 s after Ctrl-C; stacks:\n{err[-8000:]}") from None
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    status = rundir.read_status(run_dir)
    assert status["state"] == "interrupted"
    expected = (
        f"interrupted at step {status['step']}; rerun the same command to resume from step {status['resume_step']}"
    )
    assert expected in err and status["resume_step"] >= 10


def test_machine_slots_share_the_hardware():
    cpu = machine_slots(jobs=4, runs_per_gpu=1, gpus_per_run=1, gpu_ids=[], cores=8)
    assert [(s.gpus, s.threads) for s in cpu] == [([], 2)] * 4
    assert [s.gpus for s in machine_slots(None, 1, 1, gpu_ids=["0", "1", "2", "3"], cores=8)] == [
        ["0"],
        ["1"],
        ["2"],
        ["3"],
    ]
    assert [s.gpus for s in machine_slots(None, 2, 1, gpu_ids=["0", "1"], cores=8)] == [["0"], ["0"], ["1"], ["1"]]
    assert [s.gpus for s in machine_slots(None, 1, 2, gpu_ids=["4", "5", "6", "7"], cores=8)] == [
        ["4", "5"],
        ["6", "7"],
    ]
    assert len(machine_slots(1, 1, 1, gpu_ids=["0", "1"], cores=8)) == 1
    from ablate.config import ConfigError

    with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
        machine_slots(None, 1, 2, gpu_ids=[], cores=2)
    with pytest.raises(ConfigError, match="--gpus-per-run: 3, but 2 GPUs"):
        machine_slots(None, 1, 3, gpu_ids=["0", "1"], cores=2)


@pytest.mark.slow
def test_launcher_local_runs_the_submitit_path_from_the_command_line(tmp_path):
    args = ["run", str(TINY), "--set", "train.max_steps=6", "--out", str(tmp_path), "--launcher", "local"]
    first = run_cli(*args)
    assert "2 runs: 2 finished" in first.stdout and "submitted job" in first.stdout, first.stdout
    for variant in ("mha", "mqa"):
        assert (tmp_path / "tiny" / variant / "seed0" / "summary.json").is_file()
    again = run_cli(*args)  # resubmitting redoes nothing
    assert "2 runs: 2 finished" in again.stdout
    assert [s for s, _ in losses(tmp_path / "tiny" / "mha" / "seed0")] == list(range(1, 7))
    bad = run_cli("run", str(TINY), "--launcher", "slurm", "--slurm", "partition=gpu,colour=blue", check=False)
    assert bad.returncode == 2 and "--slurm colour: unknown option; allowed: partition" in bad.stderr


def test_wrong_status_and_report_options_get_one_line(tmp_path):
    for args, expected in (
        (["status", str(tmp_path), "--watch", "0"], "--watch 0: allowed: seconds in (0, 86400]"),
        (["report", str(tmp_path), "--power", "1.5"], "--power 1.5: allowed: in (0, 1)"),
        (["report", str(tmp_path), "--min-seeds", "1"], "--min-seeds 1: allowed: a whole number"),
        (["run", str(TINY), "--jobs", "0"], "--jobs 0: allowed: a whole number >= 1"),
    ):
        result = cli_in_process(*args, check=False)
        assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr, args
