"""Loss spikes and stability monitors (callbacks/stability.py): the robust z-score on constructed curves, then tiny
runs in which one batch of the data is garbage, so the loss really spikes and the real detector must find it under
each train.spike_policy."""

import json
import math
import random
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ablate import rundir
from ablate.config import TrainConfig
from ablate.setup.experiment import load_experiment
from ablate.training.callbacks import Callback, StepValues
from ablate.training.callbacks.stability import LossSpikes, local_shard, robust_z
from ablate.training.run import run_dir_for, train
from conftest import TINY, run_cli

SPIKE_AT = 24  # the step whose batch is garbage (the 24th batch read)
TINY_SPIKES = {"train.max_steps": "32", "train.spike_window": "16", "train.spike_threshold": "10"}
# a short window (the tiny curve has few steps before the spike) estimates the noise loosely: a higher threshold


# -- the detector on constructed loss curves -----------------------------------------------------------------------


def detector(policy: str = "log", window: int = 50) -> LossSpikes:
    """LossSpikes as a run with this spike_policy and spike_window (and the default threshold) makes it."""
    return LossSpikes(TrainConfig().spike_threshold, window, policy)


def fake_trainer():
    """What LossSpikes reads of a Trainer, with its console lines and logged fields (at their steps) kept."""
    trainer = SimpleNamespace(step=0, last_loss=math.nan, last_grad_norm=1.0, rollbacks=[], said=[], logged=[])
    trainer.say = trainer.said.append
    trainer.log = lambda fields, at=None: trainer.logged.append((trainer.step if at is None else at.step, fields))
    return trainer


def feed(spikes: LossSpikes, trainer, losses) -> list[str]:
    """Each loss through the callback as the trainer would: before_update, then (once the step counts) the step's
    figures to step_values and post_step. The verdicts' actions (take, skip, rollback, stop)."""
    actions = []
    for loss in losses:
        trainer.last_loss = loss
        verdict = spikes.before_update(trainer)
        actions.append(verdict.action)
        trainer.step += 1
        spikes.step_values(trainer, StepValues(trainer.step, 0, loss, trainer.last_grad_norm))
        spikes.post_step(trainer)
    return actions


def noisy_falling_curve(steps: int = 500, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [2.5 + 4.0 * math.exp(-step / 120) + rng.gauss(0, 0.03) for step in range(steps)]


def test_robust_z_of_a_known_window():
    z, median = robust_z([1.0, 2.0, 3.0, 4.0, 100.0], 10.0)  # one outlier moves neither median nor MAD much
    assert median == 3.0 and z == pytest.approx((10.0 - 3.0) / (1.4826 * 1.0))
    assert robust_z([2.0] * 10, 2.0)[0] == 0 and robust_z([2.0] * 10, 2.1)[0] > 1e6  # no spread: finite, huge


def test_no_spike_on_a_smooth_noisy_falling_curve():
    losses = noisy_falling_curve()
    spikes, trainer = detector(), fake_trainer()
    assert set(feed(spikes, trainer, losses)) == {"take"}
    worst = max(robust_z(losses[i - 50 : i], losses[i])[0] for i in range(50, len(losses)))
    print(f"largest z over 500 noisy falling steps: {worst:.2f} (threshold 6)")
    assert spikes.spikes == [] and trainer.said == [] and worst < 6


def test_a_tenfold_jump_is_flagged_and_kept_out_of_the_window_when_skipped():
    losses = noisy_falling_curve()
    losses[300] *= 10
    for policy in ("log", "skip"):
        spikes, trainer = detector(policy), fake_trainer()
        verdicts = feed(spikes, trainer, losses[:301])
        window_steps = [step for step, _ in spikes.window]
        assert window_steps == [*range(251 if policy == "skip" else 252, 301), *([301] if policy == "log" else [])]
        verdicts += feed(spikes, trainer, losses[301:])  # a logged spike in the window hides nothing after it
        assert [(s["step"], s["action"]) for s in spikes.spikes] == [(301, policy)]  # steps count from 1
        assert spikes.spikes[0]["z"] > 100 and verdicts[300] == {"log": "take", "skip": "skip"}[policy]
        assert len(verdicts) - verdicts.count("take") <= 1
        assert "step 301: loss spike" in trainer.said[0]
        assert [step for step, fields in trainer.logged] == [301] and "stability/spike_z" in trainer.logged[0][1]


def test_no_detection_before_the_window_has_eight_losses():
    spikes, trainer = detector(), fake_trainer()
    feed(spikes, trainer, [3.0, 3.01, 2.99, 3.0, 3.02, 2.98, 3.0, 300.0])  # the 8th loss sees 7 before it
    assert spikes.spikes == []
    feed(spikes, trainer, [3.0, 300.0])
    assert [s["step"] for s in spikes.spikes] == [10]


def test_resumed_detector_finds_the_same_spikes():
    """The state goes through JSON as in a checkpoint's meta.json: a run cut in two finds what a straight run does."""
    losses = noisy_falling_curve()
    for step in (120, 260, 261, 400):
        losses[step] += 2.0
    straight, trainer = detector("skip"), fake_trainer()
    feed(straight, trainer, losses)
    first, trainer = detector("skip"), fake_trainer()
    feed(first, trainer, losses[:250])
    resumed = detector("skip")
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    feed(resumed, trainer, losses[250:])
    assert [s["step"] for s in straight.spikes] == [121, 261, 262, 401]
    assert resumed.spikes == straight.spikes and resumed.window == straight.window


def test_a_rollback_drops_the_abandoned_steps_losses_from_the_window():
    spikes, trainer = detector(), fake_trainer()
    feed(spikes, trainer, noisy_falling_curve(30))
    trainer.step = 20  # restored to a checkpoint of step 20: steps 21..30 never happened
    spikes.pre_train(trainer)
    assert [step for step, _ in spikes.window] == list(range(1, 21))


# -- real runs with one garbage batch ------------------------------------------------------------------------------


class GarbageBatch(Callback):
    """Test-only: the batch of the `at`-th read of the sampler is replaced by random tokens (a real spike: the
    model is scored on data it cannot predict). It follows the batch, not the step number, so after a rollback the
    steps taken again read other data. Keeps the weights (local shards) after steps at-1 and at. The run uses this
    very instance, not a copy (__deepcopy__), so the test can read what it saw."""

    name, order = "garbage_batch", 1

    def __init__(self, at: int):
        self.at, self.reads, self.poisoned, self.garbage_served = at, 0, set(), 0
        self.weights: dict[int, list[torch.Tensor]] = {}
        self.installed = False

    def __deepcopy__(self, memo):
        return self

    def pre_train(self, trainer) -> None:
        if self.installed:  # pre_train comes again after a rollback
            return
        self.installed = True
        take, batch = trainer.sampler.take, trainer.data.train.batch

        def counted_take(n):
            indices = take(n)
            self.reads += 1
            if self.reads == self.at:
                self.poisoned = set(indices.tolist())
            return indices

        def garbage_batch(indices, seq_len):
            inputs, targets, doc_ids = batch(indices, seq_len)
            if self.poisoned & set(int(i) for i in indices):
                self.garbage_served += 1
                tokens = torch.randint(
                    0,
                    trainer.data.vocab_size,
                    (2, *inputs.shape),
                    generator=torch.Generator().manual_seed(self.garbage_served),
                )
                inputs, targets = tokens[0], tokens[1]
            return inputs, targets, doc_ids

        trainer.sampler.take, trainer.data.train.batch = counted_take, garbage_batch

    def post_step(self, trainer) -> None:
        if trainer.step in (self.at - 1, self.at):
            self.weights[trainer.step] = [local_shard(p).clone() for p in trainer.model.parameters()]


def spiked_run(tmp_path, policy: str, **overrides):
    """A tiny run whose SPIKE_AT-th batch is garbage: (run, run folder, summary or the exception, GarbageBatch)."""
    garbage = GarbageBatch(SPIKE_AT)
    run = load_experiment(TINY, only=["mha"], overrides={**TINY_SPIKES, "train.spike_policy": policy, **overrides})[0]
    try:
        result = train(run, tmp_path, callbacks=[garbage])
    except rundir.RunDiverged as exc:
        result = exc
    return run, run_dir_for(tmp_path, run), result, garbage


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / rundir.METRICS).read_text().splitlines()]


def train_losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


def final_meta(run_dir, step: int) -> dict:
    return json.loads((rundir.checkpoint_root(run_dir) / rundir.step_dir_name(step) / rundir.CKPT_META).read_text())


def test_log_policy_records_the_spike_and_takes_the_update(tmp_path):
    run, run_dir, summary, garbage = spiked_run(tmp_path, "log")
    (spike,) = summary["spikes"]  # exactly one: the real curve around it raises nothing
    print(f"injected spike: loss {spike['loss']:.3f}, median {spike['median']:.3f}, z {spike['z']:.1f}")
    assert spike["step"] == SPIKE_AT and spike["action"] == "log" and spike["z"] > 2 * run.train.spike_threshold
    assert summary["steps"] == 32 and summary["skipped_steps"] == 0 and garbage.garbage_served == 2  # 2 micro-batches
    assert train_losses(run_dir)[SPIKE_AT] == spike["loss"]
    logged = [r for r in metrics(run_dir) if "stability/spike_z" in r]
    assert [(r["step"], r["stability/spike_z"]) for r in logged] == [(SPIKE_AT, spike["z"])]
    changed = [not torch.equal(a, b) for a, b in zip(garbage.weights[SPIKE_AT - 1], garbage.weights[SPIKE_AT])]
    assert all(changed)  # the update was taken


def test_skip_policy_leaves_the_weights_of_the_spiking_step_alone(tmp_path):
    run, run_dir, summary, garbage = spiked_run(tmp_path, "skip")
    (spike,) = summary["spikes"]
    assert spike["step"] == SPIKE_AT and spike["action"] == "skip"
    assert summary["steps"] == 32 and summary["skipped_steps"] == 1
    assert all(torch.equal(a, b) for a, b in zip(garbage.weights[SPIKE_AT - 1], garbage.weights[SPIKE_AT]))
    window_steps = [step for step, _ in final_meta(run_dir, 32)["callbacks"]["loss_spikes"]["window"]]
    assert window_steps == [*range(16, 24), *range(25, 33)]  # the last 16 updates taken: not the spike's
    assert math.isfinite(summary["final_loss"])


def test_rollback_policy_restores_the_checkpoint_and_reads_past_the_bad_batch(tmp_path):
    run, run_dir, summary, garbage = spiked_run(tmp_path, "rollback")
    (spike,) = summary["spikes"]
    assert spike["step"] == SPIKE_AT and spike["action"] == "rollback"
    (rollback,) = summary["rollbacks"]
    assert rollback["from_step"] == SPIKE_AT - 1 and rollback["to_step"] == 20  # ckpt_every=4
    assert f"step {SPIKE_AT}" in rollback["reason"]
    assert summary["steps"] == 32 and summary["skipped_steps"] == 0
    # steps 21..24 were read once more from new data: 4 more batches, and the garbage one was read once
    assert garbage.reads == 32 + 4 and garbage.garbage_served == 2
    assert final_meta(run_dir, 32)["sampler"]["cursor"] == (32 + 4) * run.train.global_batch
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, 33)) and losses[SPIKE_AT] < spike["loss"] - 0.5  # step 24 again
    # the abandoned steps 21..23 left the window at the rollback: each step is in it once
    window_steps = [step for step, _ in final_meta(run_dir, 28)["callbacks"]["loss_spikes"]["window"]]
    assert window_steps == list(range(13, 29))


def test_rollback_before_any_checkpoint_ends_the_run_as_diverged(tmp_path):
    run, run_dir, error, _ = spiked_run(tmp_path, "rollback", **{"train.ckpt_every": "0"})
    assert isinstance(error, rundir.RunDiverged) and "no checkpoint to roll back to yet" in str(error)
    assert rundir.read_status(run_dir)["state"] == "diverged"


def test_stop_policy_ends_the_run_as_diverged_naming_the_spike(tmp_path):
    run, run_dir, error, _ = spiked_run(tmp_path, "stop")
    assert isinstance(error, rundir.RunDiverged)
    status = rundir.read_status(run_dir)
    assert status["state"] == "diverged" and status["step"] == SPIKE_AT - 1
    for words in (f"step {SPIKE_AT}: loss spike", " z ", "above the median", "spike_policy=stop"):
        assert words in status["message"]
    assert not (run_dir / rundir.SUMMARY).exists()


# -- monitors ------------------------------------------------------------------------------------------------------

MONITORS = {"train.max_steps": "10", "train.monitor_every": "5", "train.ckpt_every": "0"}


def monitor_rows(run_dir) -> dict[int, dict]:
    return {
        r["step"]: {k: v for k, v in r.items() if k.startswith("stability/")}
        for r in metrics(run_dir)
        if "stability/max_attention_logit" in r
    }


@pytest.fixture(scope="module")
def monitored_run(tmp_path_factory):
    """The run folder of a 10-step tiny run in this process, monitored every 5 steps."""
    out = tmp_path_factory.mktemp("monitored")
    run = load_experiment(TINY, only=["mqa"], overrides=MONITORS)[0]
    train(run, out)
    return run_dir_for(out, run)


def test_monitors_are_logged_every_monitor_every_steps(monitored_run):
    run_dir = monitored_run
    rows = monitor_rows(run_dir)
    assert sorted(rows) == [5, 10]
    blocks = ["embedding", "layer0", "layer1", "head"]
    for row in rows.values():
        assert set(row) == {
            "stability/max_attention_logit",
            "stability/output_logit_norm",
            *(f"stability/attention_logit_max/layer{i}" for i in range(2)),
            *(f"stability/update_ratio/{b}" for b in blocks),
        }
        assert all(math.isfinite(v) for v in row.values())
        assert row["stability/max_attention_logit"] == max(
            row[f"stability/attention_logit_max/layer{i}"] for i in range(2)
        )
        assert all(0 < row[f"stability/update_ratio/{b}"] < 1 for b in blocks)
        assert row["stability/output_logit_norm"] > 0
    assert rows[10]["stability/update_ratio/layer0"] < rows[5]["stability/update_ratio/layer0"]  # lr decays
    events = EventAccumulator(str(run_dir / rundir.TENSORBOARD))
    events.Reload()
    for tag in (
        "stability/max_attention_logit",
        "stability/output_logit_norm",
        "stability/update_ratio/layer1",
        "stability/attention_logit_max/layer0",
    ):
        assert [e.step for e in events.Scalars(tag)] == [5, 10]


@pytest.mark.slow
def test_monitors_are_the_same_for_one_and_two_gloo_processes(monitored_run, tmp_path):
    args = ["run", str(TINY), "--only", "mqa", *(x for k, v in MONITORS.items() for x in ("--set", f"{k}={v}"))]
    run_cli(*args, "--out", str(tmp_path), torchrun_procs=2)
    one, two = monitor_rows(monitored_run), monitor_rows(tmp_path / "tiny" / "mqa" / "seed0")
    assert sorted(one) == sorted(two) == [5, 10] and set(one[5]) == set(two[5])
    worst = max(abs(one[s][k] - two[s][k]) / abs(one[s][k]) for s in one for k in one[s])
    print(f"largest relative monitor difference, 2 gloo ranks vs 1 process: {worst:.2e}")
    assert worst < 1e-5  # float rounding only


def test_the_trend_line_finds_a_spike_while_the_loss_still_falls_fast():
    """Early in training the fall itself widens a plain median/MAD window; the robust line through the window
    leaves only the noise, so a bump of 0.5 (about 17 noise sd) at step 40 is found, and nothing else is."""
    losses = noisy_falling_curve(200)
    plain = robust_z(losses[:39][-30:], losses[39] + 0.5)[0]
    losses[39] += 0.5
    spikes, trainer = detector("log", window=30), fake_trainer()
    feed(spikes, trainer, losses)
    assert [s["step"] for s in spikes.spikes] == [40] and plain < 6  # the plain median would have missed it


def test_rollbacks_are_capped():
    """A run that keeps spiking after MAX_ROLLBACKS rollbacks ends as diverged instead of looping."""
    from ablate.training.callbacks.stability import MAX_ROLLBACKS

    losses = noisy_falling_curve(100)
    losses[80] *= 10
    spikes, trainer = detector("rollback"), fake_trainer()
    assert feed(spikes, trainer, losses[:80]) == ["take"] * 80
    trainer.rollbacks, trainer.last_loss = [{}] * MAX_ROLLBACKS, losses[80]
    verdict = spikes.before_update(trainer)  # the trainer raises Divergence(reason): the run diverged
    assert verdict.action == "stop" and verdict.reason.startswith("step 81: loss spike")
    assert f"already rolled back {MAX_ROLLBACKS} times, stopped" in verdict.reason
    trainer.rollbacks = [{}] * (MAX_ROLLBACKS - 1)  # one rollback left: rolled back
    assert spikes.before_update(trainer).action == "rollback" and trainer.said[-1].endswith("rolling back")
