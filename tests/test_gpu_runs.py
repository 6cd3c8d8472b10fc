"""Whole runs on a GPU through the CLI, as a user starts them (marked gpu: skipped, saying so, where none is visible).

The tiny experiment in bf16 with the torch references, the Triton kernels and compiled blocks; MLA, MoE and
document masks against the same run on CPU; a run killed and resumed; a checkpoint written on CPU resumed on the GPU;
three runs two to a GPU, each with its own peak memory; `ablate eval --device cuda` against CPU; float8 compiled.
Each run is a fresh `ablate` process (conftest.run_cli), so what a process keeps (a process group, CUDA's context,
compile caches) is the user's too.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, TINY, run_cli

pytestmark = pytest.mark.gpu

BF16 = ["--set", "train.dtype=bf16"]
ON_GPU = ["--set", "train.device=cuda"]


def tiny_run(out, *settings, variant="mha", experiment=TINY):
    """`ablate run` of one variant of an experiment into `out`; its run folder."""
    run_cli("run", str(experiment), "--only", variant, "--out", str(out), *settings)
    return out / experiment.stem / variant / "seed0"


def summary(run_dir) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def losses(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def kill_after_checkpoint(args, out, run_dir, step, hide_gpu=False):
    """Start `ablate run ARGS --out OUT`, SIGKILL it once checkpoint `step` is complete (its meta.json written)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"CUDA_VISIBLE_DEVICES": ""} if hide_gpu else {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate", *args, "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.time() + 300
    while not (run_dir / "checkpoints" / f"step_{step}" / "meta.json").exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-3000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "summary.json").exists(), "the run ended before it could be killed"


@pytest.fixture(scope="module")
def torch_bf16_run(tmp_path_factory):
    """The tiny experiment's mha on the GPU in bf16, eager, with the torch references: what the others match."""
    out = tmp_path_factory.mktemp("torch_bf16")
    return tiny_run(out, *ON_GPU, *BF16, "--set", "model.kernels=torch", "--set", "train.compile=false")


@pytest.mark.parametrize(
    "kernels,compiled", [("triton", "false"), ("torch", "true"), ("triton", "true")], ids=["triton", "compiled", "both"]
)
def test_tiny_bf16_run_with_triton_or_compile_follows_the_torch_run(torch_bf16_run, tmp_path, kernels, compiled):
    settings = ["--set", f"model.kernels={kernels}", "--set", f"train.compile={compiled}"]
    run_dir = tiny_run(tmp_path, *ON_GPU, *BF16, *settings)
    got, want = losses(run_dir), losses(torch_bf16_run)
    assert sorted(got) == sorted(want) == list(range(1, 9))
    # bf16 with other kernels or fused ops: rounding differs in the last bits of each step, not the curve
    worst = max(abs(got[s] - want[s]) for s in want)
    print(f"largest loss difference against the torch run over 8 steps: {worst:.2e}")
    assert worst < 0.05
    assert summary(run_dir)["final_val_loss"] == pytest.approx(summary(torch_bf16_run)["final_val_loss"], abs=0.05)


@pytest.mark.parametrize(
    "knobs",
    [
        ["model.attention=mla"],
        ["model.ffn=moe", "model.moe_experts=4", "model.moe_shared_experts=1"],
        ["data.doc_mask=true"],
        ["model.attention=mla", "model.ffn=moe", "model.moe_experts=4", "data.doc_mask=true"],
    ],
    ids=["mla", "moe", "doc_mask", "all"],
)
def test_mla_moe_and_document_masks_on_the_gpu_follow_the_cpu(tmp_path, knobs):
    """fp32 with the Triton kernels on the GPU against the torch references on CPU; then the same in bf16 on the GPU,
    which must learn too."""
    settings = [arg for knob in knobs for arg in ("--set", knob)] + ["--set", "train.dtype=fp32"]
    cpu = tiny_run(tmp_path / "cpu", *settings, "--set", "train.device=cpu", "--set", "model.kernels=torch")
    gpu = tiny_run(tmp_path / "gpu", *settings, *ON_GPU, "--set", "model.kernels=triton")
    # same data and initial weights; a router may flip a near-tied expert choice, so not to the last digits
    assert summary(gpu)["final_loss"] == pytest.approx(summary(cpu)["final_loss"], rel=1e-2)
    assert summary(gpu)["final_val_loss"] == pytest.approx(summary(cpu)["final_val_loss"], rel=1e-2)
    bf16 = losses(tiny_run(tmp_path / "bf16", *settings[:-2], *ON_GPU, *BF16, "--set", "model.kernels=triton"))
    assert all(math.isfinite(v) for v in bf16.values()) and bf16[8] < bf16[1]


def test_a_run_killed_on_the_gpu_resumes_and_follows_the_uninterrupted_run(tmp_path):
    args = ["run", str(TINY), "--only", "mha", *ON_GPU, "--set", "train.max_steps=120", "--set", "train.ckpt_every=20"]
    run_cli(*args, "--out", str(tmp_path / "straight"))
    killed = tmp_path / "killed" / "tiny" / "mha" / "seed0"
    kill_after_checkpoint(args, tmp_path / "killed", killed, step=20)
    resumed = run_cli(*args, "--out", str(tmp_path / "killed"))
    assert "resumed from" in resumed.stdout
    got, want = losses(killed), losses(tmp_path / "straight" / "tiny" / "mha" / "seed0")
    assert sorted(got) == list(range(1, 121))
    # bf16 (auto on a GPU) and attention backward's atomics: not bit-exact on a GPU, but the same curve
    assert max(abs(got[s] - want[s]) for s in want) < 0.05


def test_a_checkpoint_written_on_cpu_resumes_on_the_gpu(tmp_path):
    """train.device=auto trains on CPU where no GPU is visible, then resumes on the GPU: the checkpoint's RNG state
    has no CUDA entry, and it must still load, not be set aside as damaged (issue 26, 6)."""
    args = ["run", str(TINY), "--only", "mha", "--set", "train.max_steps=40", "--set", "train.ckpt_every=2"]
    run_dir = tmp_path / "tiny" / "mha" / "seed0"
    kill_after_checkpoint(args, tmp_path, run_dir, step=2, hide_gpu=True)
    resumed = run_cli(*args, "--out", str(tmp_path))
    assert "resumed from" in resumed.stdout, resumed.stdout
    assert not list((run_dir / "checkpoints").glob("damaged_*")), resumed.stdout
    assert summary(run_dir)["steps"] == 40 and math.isfinite(summary(run_dir)["final_loss"])


SLOTS_EXPERIMENT = """
from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, variant

small = RunConfig(
    model=ModelConfig(vocab_size=512, d_model=32, n_layers=2, n_heads=4),
    data=DataConfig(source="default", max_documents=400, seq_len=32, val_sequences=8),
    train=TrainConfig(max_steps=8, global_batch=8, micro_batch=4, val_every=0, ckpt_every=0),
)
# two slots: "big" and "long" start together, "after" takes the slot "big" leaves (same worker process)
runs = [
    variant(small, "big", {"model.d_model": 512, "model.n_heads": 8}),
    variant(small, "long", {"train.max_steps": 400}),
    variant(small, "after"),
]
"""


def test_runs_per_gpu_2_gives_each_of_three_runs_its_own_peak_memory(tmp_path):
    experiment = tmp_path / "slots.py"
    experiment.write_text(SLOTS_EXPERIMENT)
    run_cli("run", str(experiment), "--runs-per-gpu", "2", "--out", str(tmp_path / "runs"), *ON_GPU)
    peaks = {
        name: summary(tmp_path / "runs" / "slots" / name / "seed0")["peak_memory_bytes"]
        for name in ("big", "long", "after")
    }
    print("peak memory per run:", peaks)
    assert all(peak > 0 for peak in peaks.values())
    # Every run's peak includes a floor its process holds whatever the model: the cuBLAS workspaces, which torch
    # takes from its caching allocator (so max_memory_allocated counts them), one per (thread's handle, stream): on
    # Hopper 32 MiB for the forward's thread and 32 MiB for autograd's, ~67 MB of the small runs' ~68 MB on an H100.
    # So the small runs cannot be compared with a quarter of the big one's ~202 MB; they are compared with each
    # other. "long" is the same model as "after" in a process no other run used; "after" runs in the process "big"
    # left. A peak carried over from "big" (not reset, or its tensors still held) would put "after" above "long" by
    # about what "big" holds above the floor.
    big_above_floor = peaks["big"] - peaks["long"]
    assert big_above_floor > 0, peaks
    assert abs(peaks["after"] - peaks["long"]) < big_above_floor / 4, peaks


@pytest.fixture(scope="module")
def cpu_trained_run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("eval"), "--set", "train.device=cpu")


def test_eval_on_cuda_scores_as_on_cpu(cpu_trained_run, tmp_path):
    logprobs = {}
    for device in ("cpu", "cuda"):
        samples = tmp_path / f"{device}.jsonl"
        scored = run_cli(
            "eval",
            str(cpu_trained_run),
            "--tasks",
            "arc_easy,copa",
            "--limit",
            "12",
            "--no-write",
            "--device",
            device,
            "--dtype",
            "fp32",
            "--log-samples",
            str(samples),
        )
        assert "arc_easy" in scored.stdout
        logprobs[device] = [
            r["logprob"] for r in map(json.loads, samples.read_text().splitlines()) if r["type"] == "request"
        ]
    assert len(logprobs["cuda"]) == len(logprobs["cpu"]) > 0
    assert max(abs(a - b) for a, b in zip(logprobs["cpu"], logprobs["cuda"])) < 1e-3


def test_float8_compiled_trains_three_steps(tmp_path):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip(f"float8 needs compute capability >= 8.9; {torch.cuda.get_device_name()} has less")
    pytest.importorskip("torchao", reason="float8 needs torchao (pip install 'ablate[float8]')")
    settings = ["--set", "train.float8=true", "--set", "train.compile=true", "--set", "train.max_steps=3"]
    run_dir = tiny_run(tmp_path, *ON_GPU, *BF16, *settings, "--set", "model.kernels=triton")
    got = losses(run_dir)
    assert sorted(got) == [1, 2, 3] and all(math.isfinite(v) for v in got.values())
    assert got[1] == pytest.approx(math.log(512), abs=0.5)
