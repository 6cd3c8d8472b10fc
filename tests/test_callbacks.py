"""Your own callbacks (ablate.training.callbacks.Callback): passed to train(), or defined in an experiment file for
`ablate run` (serially and side by side); their state in checkpoints; the verdicts before each update. Tiny runs of
a few steps."""

import json
import math
import re
import textwrap

import pytest

from ablate import rundir
from ablate.config import ConfigError
from ablate.setup.experiment import load_experiment
from ablate.training.callbacks import Callback, TrainerView, Verdict, whole
from ablate.training.run import run_dir_for, train
from conftest import TINY, cli_in_process, run_cli

SHORT = {"train.max_steps": "8", "train.val_every": "0"}  # checkpoints at 4 and 8 (tiny's ckpt_every=4)


def tiny_run(**overrides):
    return load_experiment(TINY, only=["mha"], overrides={**SHORT, **overrides})[0]


def metrics(run_dir) -> list[dict]:
    return rundir.read_jsonl(run_dir / rundir.METRICS)


class EmbeddingNorm(Callback):
    """The README's example: the norm of the embedding weights every `every` steps."""

    name = "embedding_norm"

    def __init__(self, every: int):
        self.every = every

    def post_step(self, trainer):
        if trainer.step % self.every == 0:
            weight = whole(trainer.model.embed.weight.detach())  # sharded above world size 1: every rank gathers
            trainer.log({"embedding_norm": weight.norm().item()})


class StepCounter(Callback):
    """State that must survive a resume: the steps it has seen, logged each step and in summary.json."""

    name = "step_counter"

    def __init__(self):
        self.seen = 0

    def post_step(self, trainer):
        self.seen += 1
        trainer.log({"seen": self.seen})

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state.get("seen", 0)

    def summary(self, trainer):
        return {"steps_seen": self.seen}


class CrashAt(Callback):
    name, order = "crash_at", 200

    def __init__(self, step: int):
        self.step = step

    def post_step(self, trainer):
        if trainer.step == self.step:
            raise RuntimeError(f"crash at step {self.step}")


class ViewCheck(Callback):
    """The trainer a callback is handed has everything TrainerView promises."""

    name = "view_check"

    def pre_train(self, trainer):
        promised = [*TrainerView.__annotations__, "log", "say", "data_counts", "resume_state"]
        missing = [m for m in promised if not hasattr(trainer, m)]
        assert len(promised) > 20 and not missing, missing


def test_a_user_callback_logs_a_statistic_and_each_run_gets_fresh_copies(tmp_path):
    norm, counter = EmbeddingNorm(every=2), StepCounter()
    run = tiny_run()
    summary = train(run, tmp_path, callbacks=[norm, counter, ViewCheck()])
    rows = metrics(run_dir_for(tmp_path, run))
    norms = {r["step"]: r["embedding_norm"] for r in rows if "embedding_norm" in r}
    assert sorted(norms) == [2, 4, 6, 8] and all(math.isfinite(v) and v > 0 for v in norms.values())
    assert len(set(norms.values())) == 4  # the weights move: a real measurement each time
    assert summary["steps_seen"] == 8 and counter.seen == 0  # the run had a copy; the instance passed is untouched
    other = tiny_run(name="again")
    assert train(other, tmp_path, callbacks=[norm, counter])["steps_seen"] == 8  # not 16: no state from before


def test_a_user_callbacks_state_is_checkpointed_and_continues_on_resume(tmp_path):
    run = tiny_run()
    with pytest.raises(RuntimeError, match="crash at step 6"):
        train(run, tmp_path, callbacks=[StepCounter(), CrashAt(6)])
    run_dir = run_dir_for(tmp_path, run)
    meta = json.loads((rundir.checkpoint_root(run_dir) / rundir.step_dir_name(4) / rundir.CKPT_META).read_text())
    assert meta["callbacks"]["step_counter"] == {"seen": 4}
    resumed = train(run, tmp_path, callbacks=[StepCounter()])  # from step 4: the count goes on from 4
    assert resumed["steps_seen"] == 8
    assert [(r["step"], r["seen"]) for r in metrics(run_dir) if "seen" in r] == [(s, s) for s in range(1, 9)]


def test_a_callback_name_that_is_taken_is_refused_before_any_folder(tmp_path):
    class Clash(Callback):
        name = "validation"

    run = tiny_run()
    with pytest.raises(ConfigError, match=r"^callbacks\[0\]: Clash is named 'validation', as is Validation"):
        train(run, tmp_path, callbacks=[Clash()])
    with pytest.raises(ConfigError, match=r"^callbacks\[1\]: StepCounter is named 'step_counter', as is StepCounter"):
        train(run, tmp_path, callbacks=[StepCounter(), StepCounter()])
    with pytest.raises(ConfigError, match=r"^callbacks\[0\]: a int; allowed: an instance of a subclass"):
        train(run, tmp_path, callbacks=[3])
    assert not tmp_path.joinpath("tiny").exists()


class SkipAt(Callback):
    name, order = "skip_at", 1  # before every standard callback: the others are asked after its veto

    def __init__(self, step: int):
        self.step = step

    def before_update(self, trainer):
        return Verdict("skip", "test") if trainer.step + 1 == self.step else None


class RollBackAt(Callback):
    """Rolls back once, at the first attempt of `step` (its flag is no checkpointed state: a rollback keeps it)."""

    name, order = "roll_back_at", 2

    def __init__(self, step: int):
        self.step, self.fired = step, False

    def before_update(self, trainer):
        if trainer.step + 1 == self.step and not self.fired:
            self.fired = True
            return Verdict("rollback", f"asked at step {self.step}")
        return Verdict("take")


class Witness(Callback):
    """Counts the times it is asked for a verdict."""

    name, order = "witness", 60

    def __init__(self):
        self.asked = 0

    def before_update(self, trainer):
        self.asked += 1

    def summary(self, trainer):
        return {"asked": self.asked}


def test_verdicts_skip_and_roll_back_and_every_callback_is_asked(tmp_path):
    run = tiny_run()
    summary = train(run, tmp_path, callbacks=[SkipAt(3), RollBackAt(6), Witness()])
    assert summary["skipped_steps"] == 1 and summary["steps"] == 8
    assert summary["rollbacks"] == [{"from_step": 5, "to_step": 4, "reason": "asked at step 6"}]
    assert summary["asked"] == 10  # steps 1-6, then 5-8 again after the rollback: asked at the skip and rollback
    losses = [r["step"] for r in metrics(run_dir_for(tmp_path, run)) if "loss" in r]
    assert losses == list(range(1, 9))  # the abandoned step 5 was dropped from the log


def test_a_stop_verdict_ends_the_run_as_diverged(tmp_path):
    class StopAt(Callback):
        name = "stop_at"

        def before_update(self, trainer):
            return Verdict("stop", "enough") if trainer.step == 2 else None

    run = tiny_run()
    with pytest.raises(rundir.RunDiverged, match="mha: enough"):
        train(run, tmp_path, callbacks=[StopAt()])
    status = rundir.read_status(run_dir_for(tmp_path, run))
    assert status["state"] == "diverged" and status["step"] == 2 and status["message"] == "mha: enough"
    with pytest.raises(ValueError, match="Verdict action 'roll_back'; allowed: take, skip, rollback, stop"):
        Verdict("roll_back")


EXPERIMENT = """
import torch
from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant, whole
from ablate.training.callbacks import Callback

base = RunConfig(experiment="own", model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
                 data=DataConfig(max_documents=400, seq_len=32, val_sequences=8),
                 train=TrainConfig(max_steps=4, global_batch=8, micro_batch=8, log_every=1, val_every=0,
                                   ckpt_every=0, peak_flops=1e11))
runs = [variant(base, "a"), variant(base, "b", {"optim.lr": 1e-3})]


class EmbeddingNorm(Callback):
    name = "embedding_norm"

    def __init__(self, every):
        self.every = every

    def post_step(self, trainer):
        if trainer.step % self.every == 0:
            trainer.log({"embedding_norm": whole(trainer.model.embed.weight.detach()).norm().item()})

"""


@pytest.mark.slow
def test_an_experiment_files_callbacks_are_used_by_ablate_run_side_by_side(tmp_path):
    path = tmp_path / "own.py"
    path.write_text(EXPERIMENT + "callbacks = [EmbeddingNorm(every=2)]\n")
    done = run_cli("run", str(path), "--jobs", "2", "--out", str(tmp_path / "runs"))
    assert "2 runs, 2 at a time" in done.stdout and "2 finished" in done.stdout, done.stdout
    for name in ("a", "b"):
        rows = metrics(tmp_path / "runs" / "own" / name / "seed0")
        assert [r["step"] for r in rows if "embedding_norm" in r] == [2, 4], name


@pytest.mark.parametrize(
    "entry,says",
    [
        (
            "callbacks = [EmbeddingNorm(2), 42]",
            r"own.py:\d+: callbacks\[1\] is a int; allowed: instances of a subclass",
        ),
        ("callbacks = EmbeddingNorm(2)", r"own.py:\d+: callbacks is a EmbeddingNorm; allowed: a list"),
        (
            "class Clash(EmbeddingNorm):\n    name = 'checkpointer'\ncallbacks = [Clash(2)]",
            r"own.py: callbacks\[0\]: Clash is named 'checkpointer', as is Checkpointer",
        ),
    ],
)
def test_bad_callbacks_in_an_experiment_file_are_refused_before_compute(tmp_path, entry, says):
    path = tmp_path / "own.py"
    path.write_text(EXPERIMENT + textwrap.dedent(entry) + "\n")
    done = cli_in_process("run", str(path), "--out", str(tmp_path / "runs"), check=False)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert re.search(says, done.stderr), done.stderr
    assert not (tmp_path / "runs").exists()
