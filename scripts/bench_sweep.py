"""Sweep throughput on this machine: 8 tiny runs with --jobs 1 and --jobs 2, and the launch overhead of a run.

    python scripts/bench_sweep.py [--steps 60] [--runs 8]

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
                 data=DataConfig(source="default", max_documents=2000, seq_len=128),
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
    """Seconds from starting a worker process to its first metrics.jsonl line (imports, process group, data
    cache, model build, peak-FLOP/s lookup, first step)."""
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
    while not (metrics.is_file() and metrics.read_text().strip()):
        if proc.poll() is not None:
            raise SystemExit("the worker ended before its first step")
        time.sleep(0.01)
    first_step = time.perf_counter() - start
    proc.wait()
    # the first logged line is step log_every (10): subtract the 9 steps after the first, at the run's own speed
    step_seconds = json.loads(metrics.read_text().splitlines()[0])
    per_step = 16 * 128 / step_seconds["tokens_per_second"]
    return first_step - 9 * per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--runs", type=int, default=8, help="a multiple of 4 (2 lrs x 2 kv-head counts x seeds)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_sweep_"))
    exp = work / "bench.py"
    exp.write_text(textwrap.dedent(EXPERIMENT.format(steps=args.steps, seeds=max(1, args.runs // 4))))
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
    overhead = launch_overhead(exp, work / "launch", env)
    print(f"{args.runs} runs x {args.steps} steps on {os.cpu_count()} cores")
    print(f"--jobs 1: {serial:.1f} s   --jobs 2: {side:.1f} s   ratio jobs1/jobs2: {serial / side:.2f}x")
    print(f"launch overhead (process start to first step): {overhead:.1f} s = {100 * overhead / 60:.1f}% of a 60 s run")


if __name__ == "__main__":
    main()
