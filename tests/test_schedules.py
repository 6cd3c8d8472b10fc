"""Batch-size schedules (data.batch_schedule) and branches (setup.variants.branch): pure plans, training under a
changing batch, bit-exact resume in the middle of a ramp, a branch's first loss equal to its parent's."""

import dataclasses
import json
import math

import pytest

from ablate import branch, variant
from ablate.config import ConfigError, TrainConfig
from ablate.data.batch_schedule import batch_plan, check_plan, lr_batch_scale, total_tokens
from ablate.optim import lr_factor
from ablate.setup.experiment import ExperimentError, load_experiment, resolve_branches
from ablate.setup.overrides import apply_overrides
from ablate.training.callbacks import Callback
from ablate.training.run import run_dir_for, train
from conftest import TINY

SEQ = 32


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def losses(run_dir):
    return {r["step"]: r["loss"] for r in metrics(run_dir) if "loss" in r}


def tiny(**train_fields):
    run = load_experiment(TINY, only=["mha"])[0]
    return dataclasses.replace(run, train=dataclasses.replace(run.train, **train_fields))


# ---------------------------------------------------------------------------------------------------------------
# plans


def test_constant_plan_is_max_steps_of_global_batch():
    train = TrainConfig(max_steps=7, global_batch=8, micro_batch=4)
    assert batch_plan(train, SEQ) == [8] * 7
    assert total_tokens(train, SEQ) == 7 * 8 * SEQ


def test_ramp_grows_linearly_in_tokens_and_sees_the_constant_runs_tokens():
    train = TrainConfig(
        max_steps=20,
        global_batch=16,
        micro_batch=4,
        batch_schedule="ramp",
        batch_start=4,
        batch_ramp_tokens=40 * 16 * SEQ // 10,
    )
    plan = batch_plan(train, SEQ)
    assert plan[0] == 4 and plan[-2] == 16 and plan[:-1] == sorted(plan[:-1])
    assert all(b % 4 == 0 for b in plan)
    seen = 0
    for b in plan[:-1]:  # each step's batch is the ramp's value at the tokens seen before it, rounded to micro_batch
        share = min(seen / train.batch_ramp_tokens, 1.0)
        assert b == max(4, int(4 + 12 * share) // 4 * 4)
        seen += b * SEQ
    assert seen + plan[-1] * SEQ == total_tokens(train, SEQ)  # the last step takes what is left: equal tokens
    assert len(plan) > 20  # smaller early batches take more steps for the same tokens


def test_stages_and_dynamic_plans():
    stages = TrainConfig(
        max_steps=10, global_batch=16, micro_batch=4, batch_schedule="stages", batch_stages="0:8,2560:16"
    )
    plan = batch_plan(stages, SEQ)
    assert plan[:10] == [8] * 10 and set(plan[10:]) == {16}  # 10 steps of 8 x 32 tokens reach 2560
    assert sum(plan) == 10 * 16
    dynamic = TrainConfig(
        max_steps=10, global_batch=16, micro_batch=4, batch_schedule="dynamic", batch_start=4, batch_ramp_tokens=512
    )
    plan = batch_plan(dynamic, SEQ)
    seen, expected = 0, []
    for _ in plan:  # 4 until 512 tokens, 8 until 1024, then 16 (capped at global_batch), the last what is left
        expected.append(min(4 if seen < 512 else 8 if seen < 1024 else 16, 10 * 16 - seen // SEQ))
        seen += expected[-1] * SEQ
    assert plan == expected and sum(plan) == 10 * 16


def test_bad_schedules_are_refused_with_the_field():
    run = tiny()
    with pytest.raises(ConfigError, match="train.batch_stages"):
        apply_overrides(run, {"train.batch_schedule": "stages", "train.batch_stages": "0:8,100:x"})
    with pytest.raises(ConfigError, match="train.batch_stages"):
        apply_overrides(run, {"train.batch_schedule": "stages", "train.batch_stages": "10:8"})  # must start at 0
    with pytest.raises(ConfigError, match="exceed train.global_batch"):
        apply_overrides(run, {"train.batch_schedule": "stages", "train.batch_stages": "0:8,100:32"})
    with pytest.raises(ConfigError, match="train.batch_start"):
        apply_overrides(run, {"train.batch_schedule": "ramp", "train.batch_ramp_tokens": 100})
    with pytest.raises(
        ConfigError,
        match=r"train.batch_stages: .*gives steps of \[12\] sequences, not multiples "
        r"of the world size \(8\)",
    ):
        check_plan(
            [8, 12],
            8,
            TrainConfig(global_batch=16, micro_batch=4, batch_schedule="stages", batch_stages="0:8,100:12,200:16"),
        )


def test_a_ramp_that_would_vanish_is_refused_naming_both_fields():
    """batch_start 4 under micro_batch 16 used to train every step at 16: a ramp compared with itself."""
    run = tiny()
    ramp = {"train.global_batch": 16, "train.micro_batch": 16, "train.batch_start": 4, "train.batch_ramp_tokens": 512}
    for kind in ("ramp", "dynamic"):
        with pytest.raises(
            ConfigError,
            match=rf"train.batch_start: {kind}: 4 is not a multiple of "
            rf"train.micro_batch=16 .*it would start at 16",
        ):
            apply_overrides(run, {**ramp, "train.batch_schedule": kind})
    with pytest.raises(
        ConfigError,
        match=r"train.batch_stages: batches \[8\] are not multiples of "
        r"train.micro_batch=16",
    ):
        apply_overrides(
            run,
            {
                "train.global_batch": 16,
                "train.micro_batch": 16,
                "train.batch_schedule": "stages",
                "train.batch_stages": "0:8,512:16",
            },
        )
    fine = apply_overrides(run, {**ramp, "train.batch_schedule": "ramp", "train.micro_batch": 4})
    assert batch_plan(fine.train, SEQ)[0] == 4  # the ramp starts where it says


def test_lr_rescale_rules():
    train = TrainConfig(global_batch=16, batch_lr_scaling="sqrt")
    assert lr_batch_scale(4, train) == pytest.approx(0.5)
    assert lr_batch_scale(4, dataclasses.replace(train, batch_lr_scaling="linear")) == pytest.approx(0.25)
    assert lr_batch_scale(4, dataclasses.replace(train, batch_lr_scaling="none")) == 1.0


def test_new_fields_at_their_defaults_keep_earlier_identities():
    run = tiny()
    assert (
        "batch_schedule" not in json.dumps(run.to_dict())
        or run.identity()
        == apply_overrides(run, {"train.batch_schedule": "constant", "optim.momentum": 0.95}).identity()
    )
    assert apply_overrides(run, {"train.spike_policy": "skip"}).identity() != run.identity()
    assert apply_overrides(run, {"train.keep_steps": [4]}).identity() == run.identity()  # bookkeeping


# ---------------------------------------------------------------------------------------------------------------
# training under a changing batch


RAMP = dict(
    max_steps=10,
    global_batch=8,
    micro_batch=2,
    batch_schedule="ramp",
    batch_start=2,
    batch_ramp_tokens=30 * 8 * SEQ // 10,
    batch_lr_scaling="sqrt",
    ckpt_every=3,
    val_every=0,
    log_every=1,
)


class StopAt(Callback):
    """Ctrl-C after a given step: the run is interrupted as a user would interrupt it."""

    order = 200

    def __init__(self, step):
        self.stop_step = step

    def post_step(self, trainer):
        if trainer.step == self.stop_step:
            raise KeyboardInterrupt


def test_ramp_trains_logs_and_resumes_bit_exactly_mid_ramp(tmp_path):
    run = tiny(**RAMP)
    plan = batch_plan(run.train, SEQ)
    straight = train(run, tmp_path / "straight")
    rows = [r for r in metrics(run_dir_for(tmp_path / "straight", run)) if "loss" in r]
    assert [r["batch"] for r in rows] == plan and straight["steps"] == len(plan)
    assert straight["tokens"] == sum(plan) * SEQ == rows[-1]["tokens"]
    for r in rows:  # the LR rescale rule, applied to each step's batch
        assert r["lr"] == pytest.approx(
            run.optim.lr * lr_factor(r["step"] - 1, len(plan), run.schedule) * math.sqrt(r["batch"] / 8)
        )

    stop = next(s for s in range(4, len(plan)) if s % 3 and plan[s] != plan[-1] and s > 3)  # after a checkpoint
    with pytest.raises(KeyboardInterrupt):
        train(run, tmp_path / "resumed", callbacks=[StopAt(stop)])
    resumed = train(run, tmp_path / "resumed")
    assert losses(run_dir_for(tmp_path / "resumed", run)) == losses(run_dir_for(tmp_path / "straight", run))
    assert resumed["tokens"] == straight["tokens"] and resumed["final_loss"] == straight["final_loss"]


# ---------------------------------------------------------------------------------------------------------------
# branches


def branch_experiment(tmp_path, body: str):
    path = tmp_path / "branches.py"
    path.write_text(f"""
from ablate import DataConfig, ModelConfig, RunConfig, ScheduleConfig, TrainConfig, branch, variant
base = RunConfig(experiment="branches", model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
                 data=DataConfig(max_documents=400, seq_len=32, val_sequences=8),
                 schedule=ScheduleConfig(name="constant", warmup=0.1),
                 train=TrainConfig(max_steps=12, global_batch=8, micro_batch=4, log_every=1, val_every=0,
                                   ckpt_every=0, peak_flops=1e11))
stable = variant(base, "stable")
{body}
""")
    return path


def test_branch_starts_from_the_parents_checkpoint_with_its_first_loss(tmp_path):
    path = branch_experiment(
        tmp_path,
        """
cool = branch(stable, at=0.5, name="cool", changes={"schedule.name": "wsd", "schedule.decay": 0.5})
wide = branch(stable, at=6, name="big_batch", changes={"train.global_batch": 16, "train.max_tokens": 12 * 8 * 32})
runs = [cool, wide, stable]  # out of order on purpose: parents train first
""",
    )
    runs = load_experiment(path)
    assert [r.name for r in runs] == ["stable", "cool", "big_batch"]
    parent = runs[0]
    assert parent.train.keep_steps == [6] and all(r.branch["parent_identity"] == parent.identity() for r in runs[1:])
    out = tmp_path / "runs"
    for run in runs:
        train(run, out)
    parent_dir = run_dir_for(out, parent)
    parent_losses = losses(parent_dir)
    assert (parent_dir / "checkpoints" / "step_6").is_dir()  # kept past keep_checkpoints for the branches
    for run in runs[1:]:
        got = losses(run_dir_for(out, run))
        assert {s: got[s] for s in range(1, 7)} == {s: parent_losses[s] for s in range(1, 7)}  # the parent's curve
    cool = losses(run_dir_for(out, runs[1]))
    assert cool[7] == parent_losses[7]  # the branch's first step: same weights, data and lr (decay starts there)
    assert cool[12] != parent_losses[12]
    big = [r for r in metrics(run_dir_for(out, runs[2])) if "loss" in r]
    assert [r["batch"] for r in big if r["step"] > 6] == [16] * 3  # 6 x 8 sequences seen, 96 - 48 left at 16
    assert big[-1]["tokens"] == 12 * 8 * SEQ
    summary = json.loads((run_dir_for(out, runs[1]) / "summary.json").read_text())
    assert summary["branch"]["step"] == 6 and summary["steps"] == 12


def test_branch_errors_name_the_problem(tmp_path):
    with pytest.raises(ExperimentError, match="changes model"):
        load_experiment(branch_experiment(tmp_path, 'runs = [stable, branch(stable, 0.5, "b", {"model.n_layers": 1})]'))
    with pytest.raises(ExperimentError, match="at=1.5"):
        load_experiment(branch_experiment(tmp_path, 'runs = [stable, branch(stable, 1.5, "b")]'))
    orphan = load_experiment(branch_experiment(tmp_path, 'runs = [stable, branch(stable, 0.5, "b")]'))[1]
    with pytest.raises(ExperimentError, match="not among the runs"):
        resolve_branches([orphan], "file.py")
    lonely = tmp_path / "lonely"
    with pytest.raises(ConfigError, match="no checkpoint at step 6"):
        train(orphan, lonely)  # the parent was never trained: refused at once, not waited for
    assert variant(orphan, "copy").branch == orphan.branch  # a variant of a branch is a branch of the same parent
    assert branch  # the public API


COOL = 'runs = [stable, branch(stable, at=0.5, name="cool", changes={"schedule.name": "wsd"})]'


def test_branch_point_follows_overrides_and_seeds(tmp_path):
    path = branch_experiment(tmp_path, COOL)
    runs = load_experiment(path, seeds=[0, 1], overrides={"train.max_steps": "10"})
    parents = {r.train.seed: r for r in runs if not r.branch}
    for run in (r for r in runs if r.branch):
        parent = parents[run.train.seed]
        assert run.branch["step"] == 5 and run.branch["tokens"] == 5 * 8 * SEQ
        assert run.branch["parent_identity"] == parent.identity() and parent.train.keep_steps == [5]
    assert len({r.identity() for r in runs}) == 4


@pytest.mark.slow
def test_branches_side_by_side_wait_for_their_parent(tmp_path):
    """--jobs 2: the branch's worker starts while its parent trains, waits for the checkpoint, then continues it."""
    from conftest import run_cli

    path = branch_experiment(tmp_path, COOL)
    done = run_cli("run", str(path), "--jobs", "2", "--out", str(tmp_path / "runs"), timeout=600)
    assert "2 finished" in done.stdout, done.stdout
    parent = losses(tmp_path / "runs" / "branches" / "stable" / "seed0")
    child = losses(tmp_path / "runs" / "branches" / "cool" / "seed0")
    assert {s: child[s] for s in range(1, 8)} == {s: parent[s] for s in range(1, 8)}
