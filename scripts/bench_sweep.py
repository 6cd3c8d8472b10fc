"""Sweep throughput on this machine: 8 tiny runs with --jobs 1 and --jobs 2, and the launch overhead of a run.

    python scripts/bench_sweep.py [--steps 60] [--runs 8]
    python scripts/bench_sweep.py --smoke      # 4 runs of 3 steps on 300 documents: checks the script runs

Prints the wall time of each side and their ratio (both run here, one after the other: a ratio, not a timing to
compare across machines), and the time from a worker's process start to its first logged step, as a share of a
60 s run. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

EXPERIMENT = """
from ablate import DataConfig, ModelConfig, RunConfig, TrainConfig, grid
base = RunConfig(experiment="bench", model=ModelConfig(vocab_size=2048, d_model=64, n_layers=2, n_heads=4),
                 data=DataConfig(source="default", max_documents={documents}, seq_len=128),
                 train=TrainConfig(max_steps={steps}, global_batch=16, micro_batch=16, log_every=10,
                                   val_every=0, ckpt_every=0))
runs = grid(base, {{"optim.lr": [1e-3, 3e-3], "model.n_kv_heads": [1, 4]}})
seeds = list(range({seeds}))
"""


def timed_run(exp: Path, out: Path, jobs: int, env: dict) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "ablate", "run", str(exp), "--out", str(out), "--jobs", str(jobs)],
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode:
        raise SystemExit(f"--jobs {jobs} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return time.perf_counter() - start


def launch_overhead(exp: Path, out: Path, env: dict) -> float:
    """Seconds from starting a worker process to its first step (imports, process group, data cache, model build,
    peak-FLOP/s lookup, first step): the time to its first metrics.jsonl line of training figures, less the steps
    between the first and that line, at the run's own speed."""
    from ablate.experiment import load_experiment
    from ablate.rundir import run_dir_for

    run = load_experiment(exp, seeds=[99])[0]
    metrics = run_dir_for(out, run) / "metrics.jsonl"
    threads = max(1, (os.cpu_count() or 1))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.sweep", json.dumps(run.to_dict()), str(out), str(threads)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # TrainMetrics' line carries tokens_per_second; other callbacks (stability monitors) log lines of their own
    while not (first := _first_train_line(metrics)):
        if proc.poll() is not None:
            raise SystemExit("the worker ended before its first logged step")
        time.sleep(0.01)
    first_step = time.perf_counter() - start
    proc.wait()
    per_step = run.train.global_batch * run.data.seq_len / first["tokens_per_second"]
    return first_step - (first["step"] - 1) * per_step


def _first_train_line(metrics: Path) -> dict | None:
    """The first complete metrics.jsonl line with tokens_per_second (a line being written has no newline yet)."""
    if not metrics.is_file():
        return None
    complete = metrics.read_text().split("\n")[:-1]
    return next((row for row in map(json.loads, complete) if "tokens_per_second" in row), None)


def measure(work: Path, steps: int, runs: int, documents: int) -> tuple[float, float, float]:
    """(--jobs 1 seconds, --jobs 2 seconds, launch overhead seconds), everything written under `work`."""
    exp = work / "bench.py"
    exp.write_text(textwrap.dedent(EXPERIMENT.format(steps=steps, seeds=max(1, runs // 4), documents=documents)))
    env = {**os.environ, "ABLATE_CACHE": str(work / "cache")}
    env.pop("OMP_NUM_THREADS", None)
    # warm the data cache and the peak-FLOP/s measurement, so both sides start equal
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate",
            "run",
            str(exp),
            "--out",
            str(work / "warm"),
            "--seeds",
            "0",
            "--only",
            "lr=0.001,n_kv_heads=1",
            "--set",
            "train.max_steps=1",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    serial = timed_run(exp, work / "jobs1", 1, env)
    side = timed_run(exp, work / "jobs2", 2, env)
    return serial, side, launch_overhead(exp, work / "launch", env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--runs", type=int, default=8, help="a multiple of 4 (2 lrs x 2 kv-head counts x seeds)")
    parser.add_argument("--smoke", action="store_true", help="4 runs of 3 steps on 300 documents")
    args = parser.parse_args()
    documents = 2000
    if args.smoke:
        args.steps, args.runs, documents = 3, 4, 300
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as work:
        serial, side, overhead = measure(Path(work), args.steps, args.runs, documents)
    print(f"{args.runs} runs x {args.steps} steps on {os.cpu_count()} cores")
    print(f"--jobs 1: {serial:.1f} s   --jobs 2: {side:.1f} s")
    print(f"ratio wall time --jobs 1 / --jobs 2: {serial / side:.2f}x")
    print(f"launch overhead (process start to first step): {overhead:.1f} s = {100 * overhead / 60:.1f}% of a 60 s run")


if __name__ == "__main__":
    main()
