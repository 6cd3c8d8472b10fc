"""Each failure under its own name, recorded where the user looks: a callback that cannot load its state fails the
run (no checkpoint set aside), divergence only from the divergence signals (any other exception is a failure with
its traceback), and a failure at any stage of train() writes error.txt and status.json."""

import json

import pytest

from ablate import rundir
from ablate.config import ConfigError
from ablate.launch.sweep import attempt
from ablate.setup.experiment import load_experiment
from ablate.training import run as run_module
from ablate.training.callbacks import Callback, CallbackStateError, Verdict
from ablate.training.run import run_dir_for, train
from conftest import TINY


def tiny(max_steps=4):
    overrides = {"train.max_steps": str(max_steps), "train.ckpt_every": "2", "train.val_every": "0"}
    return load_experiment(TINY, only=["mha"], overrides=overrides)[0]


def status_of(run_dir):
    return json.loads((run_dir / rundir.STATUS).read_text())


class ReadsN(Callback):
    """A user's callback whose load_state_dict reads a key it assumes is there (a checkpoint written before the
    callback was added holds no state for it: {})."""

    name = "reads_n"

    def __init__(self):
        self.n = 0

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


def test_a_callback_that_cannot_load_its_state_fails_the_run_and_sets_no_checkpoint_aside(tmp_path):
    run = tiny(max_steps=4)
    run_dir = run_dir_for(tmp_path, run)
    train(run, tmp_path)
    (run_dir / rundir.SUMMARY).unlink()  # as if stopped after its last checkpoint: the next call resumes
    kept = sorted(p.name for p in rundir.checkpoint_root(run_dir).iterdir())
    with pytest.raises(CallbackStateError) as caught:
        train(run, tmp_path, callbacks=[ReadsN()])
    message = str(caught.value)
    assert "callback 'reads_n'" in message and "KeyError: 'n'" in message and "step_4" in message
    assert sorted(p.name for p in rundir.checkpoint_root(run_dir).iterdir()) == kept  # every checkpoint stays
    status = status_of(run_dir)
    assert status["state"] == "failed" and "reads_n" in status["message"]
    assert "load_state_dict" in (run_dir / rundir.ERROR).read_text()  # the callback's own line, in the traceback


class Raises(Callback):
    name = "raises"

    def __init__(self, exc):
        self.exc = exc

    def post_step(self, trainer):
        raise self.exc


class Stops(Callback):
    name = "stops"

    def before_update(self, trainer):
        return Verdict("stop", "my monitor saw the loss leave")


def test_a_floating_point_error_from_a_bug_is_a_failure_with_its_traceback_not_a_divergence(tmp_path):
    run = tiny(max_steps=2)
    run_dir = run_dir_for(tmp_path, run)
    with pytest.raises(FloatingPointError, match="numpy said overflow"):
        train(run, tmp_path, callbacks=[Raises(FloatingPointError("numpy said overflow"))])
    assert status_of(run_dir)["state"] == "failed"
    assert "post_step" in (run_dir / rundir.ERROR).read_text()


def test_a_stop_verdict_is_a_divergence(tmp_path):
    run = tiny(max_steps=2)
    run_dir = run_dir_for(tmp_path, run)
    with pytest.raises(rundir.RunDiverged, match="my monitor saw the loss leave"):
        train(run, tmp_path, callbacks=[Stops()])
    status = status_of(run_dir)
    assert status["state"] == "diverged" and "my monitor saw the loss leave" in status["message"]
    assert not (run_dir / rundir.ERROR).exists()


def _fail_distributed_setup(monkeypatch):
    def init_distributed(device):
        raise RuntimeError("the process group could not reach its store")

    monkeypatch.setattr(run_module, "init_distributed", init_distributed)
    return RuntimeError, "the process group could not reach its store"


def _fail_world_check(monkeypatch):
    check_run = run_module.check_run

    def checked_for_a_world(run, world=None, **kwargs):
        if world is not None:  # the second check, against the world the process group found
            raise ConfigError("train.global_batch: 8 does not divide over 3 ranks")
        return check_run(run, world, **kwargs)

    monkeypatch.setattr(run_module, "check_run", checked_for_a_world)
    return ConfigError, "does not divide over 3 ranks"


def _fail_folder_decision(monkeypatch):
    def largest_pass(*args):  # called while config.json is written: the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_module, "largest_pass", largest_pass)
    return OSError, "No space left on device"


STAGES = {
    "distributed set-up": _fail_distributed_setup,
    "world check": _fail_world_check,
    "folder decision": _fail_folder_decision,
}


@pytest.mark.parametrize("stage", STAGES)
def test_a_failure_before_training_is_recorded_in_the_run_folder(tmp_path, monkeypatch, stage):
    kind, text = STAGES[stage](monkeypatch)
    run = tiny()
    run_dir = run_dir_for(tmp_path, run)
    with pytest.raises(kind, match=text):
        train(run, tmp_path)
    status = status_of(run_dir)
    assert status["state"] == "failed" and text in status["message"]
    assert status["error_file"] == str(run_dir / rundir.ERROR)
    assert text in (run_dir / rundir.ERROR).read_text() and "Traceback" in (run_dir / rundir.ERROR).read_text()
    assert not rundir.RunLock(run_dir).held_by_live_process()  # the lock taken to record it is released
    # a sweep's message points at a traceback that exists (a config error's message is whole as it is)
    state, message = attempt(run, tmp_path)
    assert state == "failed" and text in message
    assert (f"(traceback: {run_dir / rundir.ERROR})" in message) == (kind is not ConfigError)


def test_a_failure_before_the_decision_leaves_a_folder_another_process_holds_alone(tmp_path, monkeypatch):
    kind, text = _fail_distributed_setup(monkeypatch)
    run = tiny()
    run_dir = run_dir_for(tmp_path, run)
    other = rundir.RunLock(run_dir)
    assert other.acquire()  # another trainer of this run (a second open file: flock excludes it in one process too)
    try:
        with pytest.raises(kind, match=text):
            train(run, tmp_path)
        assert not (run_dir / rundir.STATUS).exists() and not (run_dir / rundir.ERROR).exists()
        state, message = attempt(run, tmp_path)
        assert state == "failed" and text in message and "traceback:" not in message
    finally:
        other.release()
