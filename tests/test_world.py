"""One experiment file at any world size: each rank takes its share of a step in passes of at most micro_batch,
the losses equal one process's, and what this machine or world cannot run is refused before any compute."""

import dataclasses
import json
import re

import pytest
import torch

from ablate.config import ConfigError, TrainConfig
from ablate.data.batch_schedule import check_plan, largest_pass, rank_passes
from conftest import TINY, cli_in_process, run_cli

# two variants whose shares per rank are not whole micro-batches at 2 ranks: 4 / 2 = 2 < 4, and 20 / 2 = 10 taken
# as 4 + 3 + 3 (one process takes 5 passes of 4)
EXPERIMENT = """
from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant
base = RunConfig(experiment="world", model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
                 data=DataConfig(source="default", max_documents=400, seq_len=32, val_sequences=8),
                 train=TrainConfig(max_steps=6, global_batch=4, micro_batch=4, log_every=1, val_every=3,
                                   ckpt_every=0, peak_flops=1e11))
runs = [variant(base, "share"), variant(base, "uneven", {"train.global_batch": 20})]
"""


def test_a_rank_takes_its_share_in_equal_passes_of_at_most_micro_batch():
    assert rank_passes(16, 2, 16) == [8]  # the reference run on 2 ranks: 8 each, in one pass
    assert rank_passes(16, 1, 16) == [16] and rank_passes(64, 2, 16) == [16, 16]  # whole micro-batches, as before
    assert rank_passes(20, 2, 4) == [4, 3, 3] and rank_passes(34, 2, 16) == [9, 8]  # fewest passes, near equal
    assert rank_passes(0, 2, 4) == []  # a step a branch's parent took
    assert largest_pass([16] * 3, 2, 16) == 8 and largest_pass([0, 8, 16], 1, 4) == 4


def test_only_a_batch_that_the_world_cannot_split_evenly_is_refused():
    check_plan([16] * 4, 2, TrainConfig(global_batch=16, micro_batch=16))  # the reference run on 2 ranks
    with pytest.raises(ConfigError, match=r"^train.global_batch: 3 is not a multiple of the world size \(2\)"):
        check_plan([3], 2, TrainConfig(global_batch=3, micro_batch=3))
    ramp = TrainConfig(global_batch=12, micro_batch=3, batch_schedule="ramp", batch_start=3, batch_ramp_tokens=99)
    with pytest.raises(ConfigError, match=r"^train.batch_start: 3 gives steps of \[3, 9\] sequences"):
        check_plan([3, 6, 9, 12], 2, ramp)
    with pytest.raises(ConfigError, match=r"^train.batch_schedule: 'ramp' with train.micro_batch=3 .*\[9\]"):
        check_plan([6, 9, 12], 2, dataclasses.replace(ramp, batch_start=6))


def _losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}, {
        r["step"]: r["val/loss"] for r in rows if "val/loss" in r
    }


@pytest.mark.slow
def test_two_gloo_processes_take_their_share_and_match_one(tmp_path):
    """micro_batch is the most a rank takes per pass: at 2 ranks the 4-sequence step is 2 per rank (said once,
    recorded in config.json), a 20-sequence step 4 + 3 + 3 per rank; the losses are one process's."""
    path = tmp_path / "world.py"
    path.write_text(EXPERIMENT)
    one = run_cli("run", str(path), "--out", str(tmp_path / "one"))
    two = run_cli("run", str(path), "--out", str(tmp_path / "two"), torchrun_procs=2)
    said = re.findall(
        r"\[share seed0\] world size 2: each rank takes 2 of a step's 4 sequences, in passes of at "
        r"most 2 \(train.micro_batch=4",
        two.stdout,
    )
    assert len(said) == 1, two.stdout
    assert "passes of at most" not in one.stdout
    for name, largest in (("share", 2), ("uneven", 4)):
        dirs = {n: tmp_path / n / "world" / name / "seed0" for n in ("one", "two")}
        held = {n: json.loads((d / "config.json").read_text()) for n, d in dirs.items()}
        assert held["one"]["rank_micro_batch"] == 4 and held["two"]["rank_micro_batch"] == largest
        assert held["two"]["world_size"] == 2 and held["two"]["identity"] == held["one"]["identity"]
        (one_train, one_val), (two_train, two_val) = _losses(dirs["one"]), _losses(dirs["two"])
        assert sorted(two_train) == list(range(1, 7)) and sorted(two_val) == sorted(one_val) == [3, 6]
        worst = max(abs(two_train[s] / one_train[s] - 1) for s in one_train)
        worst_val = max(abs(two_val[s] / one_val[s] - 1) for s in one_val)
        print(
            f"{name}: largest relative loss difference, 2 gloo ranks vs 1 process: train {worst:.1e}, "
            f"val {worst_val:.1e}"
        )
        assert worst < 1e-5 and worst_val < 1e-5


@pytest.mark.slow
def test_a_global_batch_two_ranks_cannot_split_is_refused_before_compute(tmp_path):
    """Each rank refuses at load (exit 2, one line), before data, a process group or a run folder exist."""
    out = tmp_path / "runs"
    done = run_cli(
        "run",
        str(TINY),
        "--only",
        "mha",
        "--set",
        "train.global_batch=3",
        "--set",
        "train.micro_batch=3",
        "--out",
        str(out),
        torchrun_procs=2,
        check=False,
    )
    ours = [line for line in done.stderr.splitlines() if line.startswith("ablate: error:")]
    assert len(set(ours)) == 1, done.stderr  # one line (from each rank that got to say it)
    assert "train.global_batch: 3 is not a multiple of the world size (2)" in ours[0]
    # the first rank to stop exits 2 (torchrun then stops the other and exits 1 itself)
    assert re.search(r"Root Cause.*?exitcode\s*: 2 ", done.stderr, re.S), done.stderr
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="refusals of a machine without a GPU")
@pytest.mark.parametrize(
    "setting,says",
    [
        ("train.float8=true", "train.float8: float8 training needs a CUDA GPU"),
        ("train.device=cuda", "train.device: 'cuda' but no CUDA device"),
    ],
)
def test_what_this_machine_cannot_run_is_refused_at_load(tmp_path, setting, says):
    done = cli_in_process(
        "run", str(TINY), "--only", "mha", "--set", setting, "--out", str(tmp_path / "runs"), check=False
    )
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and says in done.stderr
    assert "allowed here" in done.stderr and not (tmp_path / "runs").exists()
