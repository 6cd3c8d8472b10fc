import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ablate.config import ConfigError
from ablate.launch.sweep import attempt
from ablate.model import Transformer
from ablate.setup.experiment import load_checked, load_experiment
from ablate.setup.overrides import apply_overrides, parse_set_args
from ablate.training.run import run_dir_for, train
from conftest import REPO, TINY, run_cli


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_losses(run_dir):
    return {r["step"]: r["loss"] for r in read_metrics(run_dir) if "loss" in r}


def val_losses(run_dir):
    return {r["step"]: r["val/loss"] for r in read_metrics(run_dir) if "val/loss" in r}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    run = load_experiment(TINY, only=["mha"], overrides={"train.max_steps": "12"})[0]
    return run, out, train(run, out)


def test_run_folder_holds_everything(tiny_run):
    run, out, summary = tiny_run
    run_dir = run_dir_for(out, run)
    assert run_dir == out / "tiny" / "mha" / "seed0"
    for key in ("final_loss", "final_val_loss", "steps", "tokens", "params", "wall_seconds", "tokens_per_second"):
        assert key in summary
    assert summary["steps"] == 12 and summary["tokens"] == 12 * 8 * 32
    assert (
        summary["params"]
        == sum(p.numel() for p in torch.nn.Embedding(512, 32).parameters())
        + 2 * (4 * 32 * 32 + 3 * 32 * 96 + 2 * 32)
        + 32
    )  # embedding (tied) + 2 blocks + final norm
    # 6 x (2 blocks + final norm + the tied output projection) + attention's 12 x layers x d_model x seq_len
    flops_per_token = 6 * summary["params"] + 12 * 2 * 32 * 32
    assert summary["flops_per_token"] == flops_per_token == Transformer(run.model, 32).flops_per_token(32)
    assert summary["flops"] == flops_per_token * summary["tokens"]
    assert summary["kv_cache_bytes_per_token"] == 2 * 32 * 2 * 2  # keys and values (d_model each), 2 layers, bf16
    losses = train_losses(run_dir)
    assert sorted(losses) == list(range(1, 13))
    assert losses[12] < losses[1] - 0.1  # it learns
    assert summary["final_loss"] == losses[12] and summary["final_val_loss"] == val_losses(run_dir)[12]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["identity"] == run.identity() and config["config"]["model"]["d_model"] == 32
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step_8", "step_12"] or sorted(
        p.name for p in (run_dir / "checkpoints").iterdir()
    ) == ["step_12", "step_8"]


def test_tensorboard_has_the_curves(tiny_run):
    run, out, _ = tiny_run
    events = EventAccumulator(str(run_dir_for(out, run) / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in (
        "train/loss",
        "train/lr",
        "train/grad_norm",
        "train/tokens_per_second",
        "train/mfu",
        "train/memory_bytes",
        "val/loss",
    ):
        assert tag in tags
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 13))
    assert all(0 < e.value < 1 for e in events.Scalars("train/mfu"))


def test_finished_run_is_not_redone(tiny_run):
    run, out, summary = tiny_run
    run_dir = run_dir_for(out, run)
    before = (run_dir / "metrics.jsonl").stat().st_mtime_ns
    assert train(run, out) == json.loads((run_dir / "summary.json").read_text())
    assert (run_dir / "metrics.jsonl").stat().st_mtime_ns == before


def test_other_config_in_same_folder_is_refused(tiny_run):
    run, out, _ = tiny_run
    with pytest.raises(ConfigError, match="holds a run of a different config"):
        train(apply_overrides(run, {"optim.lr": 1e-4}), out)


@pytest.mark.slow
def test_rerun_with_eval_tasks_added_says_the_run_is_finished_and_how_to_score_them(tmp_path):
    settings = ["--set", "train.max_steps=2", "--set", "train.val_every=0"]
    run = load_experiment(TINY, only=["mha"], overrides=parse_set_args(settings[1::2]))[0]
    train(run, tmp_path)
    run_dir = run_dir_for(tmp_path, run)
    tasks = ["--set", "eval.tasks=copa,arc_easy", "--set", "eval.limit=4"]
    rerun = run_cli("run", str(TINY), "--only", "mha", *settings, *tasks, "--out", str(tmp_path))
    line = next(x for x in rerun.stdout.splitlines() if x.startswith("run 1/1 finished"))
    assert (
        f"; already finished ({run_dir / 'summary.json'}); not trained again; eval.tasks copa,arc_easy were "
        f"not scored at its last step: score them with ablate eval {run_dir} --tasks copa,arc_easy --format cf "
        f"--limit 4" in line
    ), rerun.stdout
    command = re.search(r"score them with (ablate eval .*)$", line).group(1)
    scored = run_cli(*shlex.split(command)[1:])  # the command as printed scores them
    assert "step 2" in scored.stdout and "copa" in scored.stdout
    state, message = attempt(apply_overrides(run, {"eval.tasks": "copa,arc_easy", "eval.limit": 4}), tmp_path)
    assert state == "finished" and "already finished" in message and "ablate eval" not in message  # scored now


@pytest.mark.slow
def test_kill_9_then_resume_matches_uninterrupted(tmp_path):
    args = ["run", str(TINY), "--only", "mha", "--set", "train.max_steps=40", "--set", "train.ckpt_every=10"]
    run_cli(*args, "--out", str(tmp_path / "straight"))
    killed_dir = tmp_path / "killed" / "tiny" / "mha" / "seed0"
    cmd = [sys.executable, "-m", "ablate", *args, "--out", str(tmp_path / "killed")]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    deadline = time.time() + 240
    while not (killed_dir / "checkpoints" / "step_10" / "meta.json").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed_dir / "summary.json").exists(), "the run ended before it could be killed"
    resumed = run_cli(*args, "--out", str(tmp_path / "killed"))
    assert "resumed from" in resumed.stdout
    straight_dir = tmp_path / "straight" / "tiny" / "mha" / "seed0"
    assert train_losses(killed_dir) == train_losses(straight_dir)  # bit-exact, every step once
    assert val_losses(killed_dir) == val_losses(straight_dir)
    assert sorted(train_losses(killed_dir)) == list(range(1, 41))


@pytest.mark.slow
def test_two_gloo_processes_match_one_and_resume_each_other(tmp_path):
    """Equal global batch (8): one process accumulates 2 micro-batches of 4 (a plain module), two processes take 4
    each (FSDP2). Then each run's step-5 checkpoint resumes at the other world size: one checkpoint format."""
    args = ["run", str(TINY), "--only", "mqa", "--set", "train.max_steps=10", "--set", "train.ckpt_every=5"]
    run_cli(*args, "--out", str(tmp_path / "one"))
    run_cli(*args, "--out", str(tmp_path / "two"), torchrun_procs=2)
    one, two = (train_losses(tmp_path / o / "tiny" / "mqa" / "seed0") for o in ("one", "two"))
    assert sorted(two) == list(range(1, 11))
    worst = max(abs(one[s] - two[s]) for s in one)
    print(f"largest loss difference, 2 gloo ranks vs 1 process, over 10 steps: {worst:.2e}")
    assert worst < 1e-4
    summary = json.loads((tmp_path / "two" / "tiny" / "mqa" / "seed0" / "summary.json").read_text())
    assert summary["world_size"] == 2
    # the validation set is the same sequences at every world size: val losses compare like with like
    one_val, two_val = (val_losses(tmp_path / o / "tiny" / "mqa" / "seed0") for o in ("one", "two"))
    assert sorted(one_val) == sorted(two_val) and max(abs(one_val[s] - two_val[s]) for s in one_val) < 1e-4
    for first, then in (("one", 2), ("two", 0)):
        run_dir = tmp_path / first / "tiny" / "mqa" / "seed0"
        (run_dir / "summary.json").unlink()
        shutil.rmtree(run_dir / "checkpoints" / "step_10")
        resumed = run_cli(*args, "--out", str(tmp_path / first), torchrun_procs=then)
        assert "resumed from" in resumed.stdout
        moved = train_losses(run_dir)
        assert sorted(moved) == list(range(1, 11))
        worst = max(abs(moved[s] - one[s]) for s in range(6, 11))
        print(f"{first} process(es) to {then or 1}, resumed at step 5: largest loss difference {worst:.2e}")
        assert worst < 1e-4


def test_validation_set_does_not_depend_on_micro_batch(tmp_path):
    """The same training at micro_batch 4 (2 accumulation steps) and 8: the same held-out documents, the same
    val loss up to float rounding (it used to score val_batches x micro_batch sequences)."""
    run = load_experiment(TINY, only=["mha"], overrides={"train.max_steps": "4", "train.ckpt_every": "0"})[0]
    items = {}
    for micro in (4, 8):
        variant = apply_overrides(run, {"train.micro_batch": micro, "name": f"micro{micro}"})
        train(variant, tmp_path)
        run_dir = run_dir_for(tmp_path, variant)
        items[micro] = {
            json.loads(line)["id"]: json.loads(line)["loss"]
            for line in (run_dir / "eval_items" / "step_0000004" / "val_loss.jsonl").open()
        }
    assert sorted(items[4]) == sorted(items[8]) == list(range(len(items[4]))) and len(items[4]) > 1
    assert max(abs(items[4][i] - items[8][i]) for i in items[4]) < 1e-4


def test_load_model_reproduces_logged_val_losses(tiny_run):
    from ablate.data import tokenizer_stats
    from ablate.data.prepare import prepare_data
    from ablate.eval.load import load_model

    run, out, summary = tiny_run
    run_dir = run_dir_for(out, run)
    loaded = load_model(run_dir)
    assert loaded.step == 12 and loaded.checkpoint.name == "step_12" and loaded.tokenizer_path.is_file()
    items = [json.loads(line) for line in (run_dir / "eval_items" / "step_0000012" / "val_loss.jsonl").open()]
    assert (
        len(items) == summary["val_scored"]["documents"]
        and sum(i["tokens"] for i in items) == (summary["val_scored"]["tokens"])
    )
    data = prepare_data(run.data, run.model.vocab_size)
    budget = run.data.val_sequences * run.data.seq_len * tokenizer_stats.VAL_BYTES_PER_TOKEN
    docs = tokenizer_stats.validation_documents(data.tokenizer_path, data.val, budget)
    picked = (0, len(items) - 1)
    windows = [w for w in docs.windows(run.data.seq_len) if w[0] in picked]
    inputs, targets = data.val.document_batch(windows, run.data.seq_len, data.eos_id)
    with torch.no_grad():
        logits = loaded.model(inputs)
    per_token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    nats = [sum(per_token[k].sum().item() for k, w in enumerate(windows) if w[0] == d) for d in picked]
    # an item's loss is its document's nats scaled by documents / tokens
    assert nats == pytest.approx([items[d]["loss"] * docs.tokens / len(items) for d in picked], rel=1e-4)
    # the items' plain mean is the per-token val loss; their bpb, the bits per byte
    assert sum(i["loss"] for i in items) / len(items) == pytest.approx(summary["final_val_loss"], abs=1e-6)
    assert sum(i["bpb"] for i in items) / len(items) == pytest.approx(summary["final_val_bpb"], abs=1e-6)
    # the same from a checkpoint folder, an older one
    assert load_model(run_dir / "checkpoints" / "step_8").step == 8


@pytest.mark.slow
def test_compile_and_bf16_switches_train_like_eager(tmp_path):
    args = ["run", str(TINY), "--only", "mha", "--set", "train.max_steps=4", "--set", "train.ckpt_every=0"]
    eager = run_cli(*args, "--out", str(tmp_path / "eager"))
    assert "run 1/1 finished mha seed0" in eager.stdout
    run_cli(*args, "--out", str(tmp_path / "compiled"), "--set", "train.compile=true")
    run_cli(*args, "--out", str(tmp_path / "bf16"), "--set", "train.dtype=bf16")
    eager_losses, compiled, bf16 = (
        train_losses(tmp_path / o / "tiny" / "mha" / "seed0") for o in ("eager", "compiled", "bf16")
    )
    assert max(abs(eager_losses[s] - compiled[s]) for s in eager_losses) < 1e-4
    assert max(abs(eager_losses[s] - bf16[s]) for s in eager_losses) < 0.05  # bf16 rounding, same training
    assert bf16 != eager_losses


@pytest.mark.slow
def test_bf16_resumes_bit_exactly(tmp_path):
    """bf16 (fp32 master weights, bf16 compute, compiled blocks): a run resumed from its step-4 checkpoint takes
    steps 5-8 to the same losses as the run that never stopped."""
    run = load_experiment(TINY, only=["mha"], overrides={"train.dtype": "bf16", "train.compile": True})[0]
    straight = train(run, tmp_path / "straight")
    run_dir = run_dir_for(tmp_path / "straight", run)
    resumed_dir = run_dir_for(tmp_path / "resumed", run)
    shutil.copytree(run_dir, resumed_dir)
    (resumed_dir / "summary.json").unlink()
    shutil.rmtree(resumed_dir / "checkpoints" / "step_8")
    resumed = train(run, tmp_path / "resumed")
    assert train_losses(resumed_dir) == train_losses(run_dir)  # bit-exact
    assert sorted(train_losses(resumed_dir)) == list(range(1, 9))
    assert val_losses(resumed_dir) == val_losses(run_dir) and resumed["final_loss"] == straight["final_loss"]


def test_resume_from_the_last_checkpoint_keeps_the_summary(tiny_run, tmp_path):
    """A run killed after its final checkpoint but before summary.json: resuming takes no step and must still
    report the final losses and speed it had reached."""
    import shutil

    run, out, summary = tiny_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (run_dir_for(copy, run) / "summary.json").unlink()
    again = train(run, copy)
    for key in ("final_loss", "final_val_loss", "steps", "tokens", "tokens_per_second"):
        assert again[key] == summary[key], key


def test_finished_note_expands_suites(tmp_path):
    """eval.tasks="small" names a suite: a run scored on its tasks at its last step is not told to score again."""
    import json

    import ablate_evals
    from ablate import rundir
    from ablate.config import EvalConfig, RunConfig
    from ablate.training.run import finished_note

    run = RunConfig(eval=EvalConfig(tasks="small"))
    small = ablate_evals.SUITES["small"]
    (tmp_path / rundir.EVALS).write_text(
        "".join(json.dumps({"step": 8, "task": t, "format": "cf"}) + "\n" for t in small[1:])
    )
    assert f"eval.tasks {small[0]} were not scored" in finished_note(run, tmp_path, {"steps": 8})
    with (tmp_path / rundir.EVALS).open("a") as f:
        f.write(json.dumps({"step": 8, "task": small[0], "format": "cf"}) + "\n")
    assert "not scored" not in finished_note(run, tmp_path, {"steps": 8})


def test_ablate_train_stays_the_function_after_every_module_is_imported(tmp_path):
    """`ablate.train` is the documented function: no module of the package is named `train` to shadow it once
    imported (a second `ablate.train(run)` in a notebook failed with "'module' object is not callable")."""
    import importlib
    import pkgutil

    import ablate

    for module in pkgutil.walk_packages(ablate.__path__, "ablate."):
        if module.name != "ablate.__main__":
            importlib.import_module(module.name)
    assert callable(ablate.train) and ablate.train.__module__ == "ablate"
    run = load_experiment(TINY, only=["mha"], overrides={"train.max_steps": "2", "train.ckpt_every": "2"})[0]
    first = ablate.train(run, tmp_path)
    assert first["steps"] == 2 and ablate.train(run, tmp_path) == first  # twice: the second finds it finished


def test_a_finished_run_is_recognised_before_any_data_work(tmp_path, monkeypatch):
    """Rerunning a finished run reads its summary and config alone: no data is prepared (its cache may be gone),
    nothing is checked again, and no file in its folder is written or touched."""
    import ablate.data.prepare
    import ablate.setup.checks

    run = load_experiment(TINY, only=["mha"], overrides={"train.max_steps": "2", "train.ckpt_every": "2"})[0]
    summary = train(run, tmp_path)
    run_dir = run_dir_for(tmp_path, run)
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*")}

    def refuse(*args, **kwargs):
        raise AssertionError("data work or checks for a finished run")

    monkeypatch.setattr(ablate.data.prepare, "prepare_data", refuse)
    monkeypatch.setattr(ablate.setup.checks, "check_data_config", refuse)
    assert train(run, tmp_path) == summary  # given unchecked (a RunConfig), it still only reads
    checked = load_checked(TINY, only=["mha"], overrides={"train.max_steps": "2", "train.ckpt_every": "2"})[0]
    assert checked.config == run and attempt(checked, tmp_path)[0] == "finished"
    assert {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in run_dir.rglob("*")} == before


@pytest.mark.slow
def test_rerunning_a_finished_sweep_with_a_cold_cache_prepares_no_data(tmp_path, monkeypatch):
    """`ablate run` again on finished runs says so without reading, hashing or tokenizing a source (the data cache
    stays empty: no BPE is trained) and without taking a lock in their folders."""
    args = ["run", str(TINY), "--only", "mha", "--set", "train.max_steps=2", "--out", str(tmp_path / "runs")]
    run_cli(*args)
    cold = tmp_path / "cold_cache"
    monkeypatch.setenv("ABLATE_CACHE", str(cold))
    again = run_cli(*args)
    assert "run 1/1 finished mha seed0" in again.stdout and "already finished" in again.stdout, again.stdout
    assert "1 run: 1 finished" in again.stdout
    assert not cold.exists() or not any(cold.iterdir())
