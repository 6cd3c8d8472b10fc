"""Checkpoints that are crafted or damaged: reading a run folder never runs code from it, a damaged checkpoint is set
aside and the run resumes from the newest intact one, and MFU is never shown above 100%."""

import json
import os
import pickle
import shutil

import pytest
import torch

from ablate import checkpoint_files
from ablate.checkpoint_files import CheckpointError, DamagedCheckpointError
from ablate.eval.load import load_model
from ablate.setup.experiment import load_experiment
from ablate.training import parallel
from ablate.training.run import run_dir_for, train
from conftest import TINY, cli_in_process, run_cli

OVERRIDES = {"train.max_steps": "12", "train.ckpt_every": "2", "train.keep_checkpoints": "3"}
CLI_SETS = [arg for key, value in OVERRIDES.items() for arg in ("--set", f"{key}={value}")]


def train_losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 12-step run with checkpoints at steps 8, 10 and 12."""
    out = tmp_path_factory.mktemp("straight")
    run = load_experiment(TINY, only=["mha"], overrides=OVERRIDES)[0]
    train(run, out)
    return run, out


def copy_of(finished, tmp_path, interrupted=True):
    """A copy of the finished run; `interrupted`: as if killed right after its step-10 checkpoint."""
    run, out = finished
    shutil.copytree(out, tmp_path / "runs")
    run_dir = run_dir_for(tmp_path / "runs", run)
    if interrupted:
        (run_dir / "summary.json").unlink()
        shutil.rmtree(run_dir / "checkpoints" / "step_12")
    return run, tmp_path / "runs", run_dir


# ---------------------------------------------------------------------------------------------------------------
# crafted files run no code


class Touch:
    """Unpickling this runs `touch <path>`: what a crafted checkpoint would do."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


def craft_metadata(ckpt, canary):
    """Hide a Touch inside a real checkpoint's .metadata, where plain pickle.load would run it."""
    path = ckpt / ".metadata"
    metadata = pickle.loads(path.read_bytes())  # our own file, written by the fixture's run
    metadata.planner_data = {"x": Touch(canary)}
    path.write_bytes(pickle.dumps(metadata))


def test_the_crafted_payload_is_real(tmp_path):
    pickle.loads(pickle.dumps(Touch(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()  # so the tests below, where it is NOT created, mean something


def refusal(ckpt):
    return (
        f"{ckpt}/.metadata: refused to unpickle posix.system: checkpoint metadata may only hold DCP metadata "
        f"classes; this file may have been crafted"
    )


def test_crafted_metadata_runs_no_code_on_resume(finished, tmp_path):
    run, out, run_dir = copy_of(finished, tmp_path)
    ckpt = run_dir / "checkpoints" / "step_10"
    craft_metadata(ckpt, tmp_path / "ran")
    with pytest.raises(CheckpointError) as caught:
        train(run, out)
    assert str(caught.value) == refusal(ckpt)
    assert not (tmp_path / "ran").exists()
    assert ckpt.is_dir()  # not damage to step around: it stays where it is, and the run stops


def test_crafted_metadata_runs_no_code_in_eval_and_export(finished, tmp_path):
    _, _, run_dir = copy_of(finished, tmp_path, interrupted=False)
    ckpt = run_dir / "checkpoints" / "step_12"
    craft_metadata(ckpt, tmp_path / "ran")
    for path in (run_dir, ckpt):
        with pytest.raises(CheckpointError, match="refused to unpickle posix.system"):
            load_model(path)
    result = cli_in_process("eval", str(run_dir), "--tasks", "copa", "--limit", "5", "--no-write", check=False)
    assert result.returncode == 2, result.stderr
    assert f"ablate: error: {refusal(ckpt)}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "ran").exists()


def test_non_tensor_entries_load_as_plain_data_only(tmp_path):
    plain = {"lr": 1e-3, "betas": (0.9, 0.95), "foreach": None, "params": ["embed.weight"]}
    checkpoint_dir = tmp_path / "plain"
    torch.distributed.checkpoint.save({"group": plain}, checkpoint_id=str(checkpoint_dir), no_dist=True)
    state = {"group": dict.fromkeys(plain)}
    checkpoint_files.dcp_load(state, checkpoint_dir)
    assert state["group"] == plain
    crafted_dir = tmp_path / "crafted"  # as if an optimizer's lr were a Touch
    torch.distributed.checkpoint.save(
        {"group": {"lr": Touch(tmp_path / "ran")}}, checkpoint_id=str(crafted_dir), no_dist=True
    )
    with pytest.raises(DamagedCheckpointError, match=r"entry group\.lr is not plain data .*posix\.system"):
        checkpoint_files.dcp_load({"group": {"lr": None}}, crafted_dir)
    assert not (tmp_path / "ran").exists()


# ---------------------------------------------------------------------------------------------------------------
# damaged checkpoints


def truncate_shard(ckpt):
    os.truncate(ckpt / "__0_0.distcp", 1000)


def zero_shard(ckpt):  # the right size, so only loading finds it
    path = ckpt / "__0_0.distcp"
    path.write_bytes(bytes(path.stat().st_size))


DAMAGES = {
    "truncated shard": (truncate_shard, "__0_0.distcp is truncated: 1000 bytes, "),
    "missing .metadata": (lambda ckpt: (ckpt / ".metadata").unlink(), ".metadata is missing"),
    "garbled meta.json": (
        lambda ckpt: (ckpt / "meta.json").write_text('{"step": 10, "wor'),
        "meta.json is unreadable: JSONDecodeError",
    ),
    "corrupt bytes in a shard": (zero_shard, "loading failed: UnpicklingError"),
}


@pytest.mark.parametrize("kind", DAMAGES)
def test_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
    finished, tmp_path, capsys, kind
):
    damage, reason = DAMAGES[kind]
    run, out, run_dir = copy_of(finished, tmp_path)
    ckpts = run_dir / "checkpoints"
    damage(ckpts / "step_10")
    capsys.readouterr()
    summary = train(run, out)
    printed = capsys.readouterr()
    assert f"resumed from {ckpts / 'step_8'} (step 8)" in printed.out
    assert f"ablate: warning: checkpoint {ckpts / 'step_10'} is damaged ({reason}" in printed.err
    assert f"): set aside as {ckpts / 'damaged_step_10'}; resuming from {ckpts / 'step_8'}\n" in printed.err
    assert reason in (ckpts / "damaged_step_10" / "REASON.txt").read_text()
    straight_dir = run_dir_for(finished[1], run)
    assert train_losses(run_dir) == train_losses(straight_dir)  # bit-exact, every step once
    assert summary["final_loss"] == json.loads((straight_dir / "summary.json").read_text())["final_loss"]
    assert sorted(p.name for p in ckpts.iterdir()) == ["damaged_step_10", "step_10", "step_12", "step_8"]


@pytest.mark.slow
def test_every_checkpoint_damaged_is_a_clear_error_not_a_restart(finished, tmp_path):
    run, out, run_dir = copy_of(finished, tmp_path)
    ckpts = run_dir / "checkpoints"
    (ckpts / "damaged_step_8").mkdir()  # set aside on an earlier attempt: the new one gets a suffix
    size = (ckpts / "step_8" / "__0_0.distcp").stat().st_size  # what the checkpoint's metadata expects
    for step in (8, 10):
        truncate_shard(ckpts / f"step_{step}")
    metrics_before = (run_dir / "metrics.jsonl").read_text()
    result = run_cli("run", str(TINY), "--only", "mha", *CLI_SETS, "--out", str(out), check=False)
    assert result.returncode != 0
    assert (
        f"{run_dir}: every checkpoint is damaged (step_10 (__0_0.distcp is truncated: 1000 bytes, {size} "
        f"expected), step_8 (__0_0.distcp is truncated: 1000 bytes, {size} expected)); set aside under "
        f"checkpoints/damaged_step_*; remove the run folder to start again from step 0"
    ) in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert sorted(p.name for p in ckpts.iterdir()) == ["damaged_step_10", "damaged_step_8", "damaged_step_8_1"]
    assert (run_dir / "metrics.jsonl").read_text() == metrics_before  # no step was taken from scratch


def test_readers_skip_a_damaged_checkpoint_and_leave_the_folder_alone(finished, tmp_path, capsys):
    _, _, run_dir = copy_of(finished, tmp_path, interrupted=False)
    ckpts = run_dir / "checkpoints"
    truncate_shard(ckpts / "step_12")
    capsys.readouterr()
    assert load_model(run_dir).step == 10
    assert (
        f"ablate: warning: checkpoint {ckpts / 'step_12'} is damaged (__0_0.distcp is truncated"
        in capsys.readouterr().err
    )
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_10", "step_12", "step_8"]
    with pytest.raises(DamagedCheckpointError) as caught:  # named explicitly: no substitute
        load_model(ckpts / "step_12")
    assert str(caught.value).startswith(f"{ckpts / 'step_12'}: damaged checkpoint (__0_0.distcp is truncated")
    assert checkpoint_files.check_checkpoint(ckpts / "step_10") is None


# ---------------------------------------------------------------------------------------------------------------
# MFU


def test_mfu_above_one_is_not_shown():
    assert parallel.mfu(1000, 6e6, 1e10) == pytest.approx(0.6)
    assert parallel.mfu(1000, 6e6, 1e9) is None  # 600%: the peak was measured too low
    assert parallel.mfu(float("nan"), 6e6, 1e10) is None


def test_peak_is_the_best_this_machine_has_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(parallel, "measure_peak_flops", lambda device, dtype: calls.append(dtype) or 5e10)
    cpu = torch.device("cpu")
    key = parallel.machine_key(cpu, torch.float32)
    assert parallel.peak_flops_for(cpu, torch.float32) == 5e10 and len(calls) == 1  # measured once per machine
    assert parallel.peak_flops_for(cpu, torch.float32) == 5e10 and len(calls) == 1  # then kept, not remeasured
    for value, expected in ((3e10, 5e10), (8e10, 8e10)):  # a busy moment never lowers it; a better one raises it
        assert parallel.remember_peak(key, value) == expected
        assert json.loads((tmp_path / "peak_flops.json").read_text()) == {key: expected}
    assert parallel.peak_flops_for(cpu, torch.float32) == 8e10
    assert key.endswith(f"|threads={torch.get_num_threads()}|float32") and key.count("|") == 3
    assert parallel.peak_flops_for(cpu, torch.bfloat16) == 5e10 and len(calls) == 2  # another dtype, its own entry
    assert [p.name for p in tmp_path.iterdir()] == ["peak_flops.json"]  # written by rename, nothing left over


def test_peak_measurement_drops_a_size_too_slow_to_repeat(monkeypatch):
    # bf16 on a CPU without bf16 units: a fixed count of large matmuls once took minutes before a run's first step
    sizes = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: sizes.append(a.shape[0]) or real_mm(a, b))
    peak = parallel.measure_peak_flops(torch.device("cpu"), torch.float32, sizes=(16, 8), seconds=0.0, rounds=3)
    assert sizes == [8] and peak > 0  # the smallest size timed once; it and every larger one dropped after
    sizes.clear()
    parallel.measure_peak_flops(torch.device("cpu"), torch.float32, sizes=(8, 16), seconds=0.05, rounds=2)
    assert sizes.count(8) > 2 and sizes.count(16) > 2  # quick sizes repeat until their time is up, every round


def test_metrics_log_no_mfu_above_one(tmp_path, capsys):
    run = load_experiment(
        TINY, only=["mha"], overrides={"train.max_steps": "2", "train.ckpt_every": "0", "train.peak_flops": "1.0"}
    )[0]
    summary = train(run, tmp_path)
    rows = [json.loads(line) for line in (run_dir_for(tmp_path, run) / "metrics.jsonl").read_text().splitlines()]
    assert [r["mfu"] for r in rows if "loss" in r] == [None, None]
    assert capsys.readouterr().out.count("mfu n/a (peak unreliable)") == 2
    assert summary["steps"] == 2
