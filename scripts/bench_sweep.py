"""Sweep throughput on this machine: 8 runs of the lr_batch_sweep model with --jobs 1 and --jobs 2, and the launch
overhead of a run.

    python scripts/bench_sweep.py [--steps 60] [--runs 8]
    python scripts/bench_sweep.py --smoke      # 4 tiny runs a side, 3 steps on 300 documents: checks the script runs

The runs are experiments/lr_batch_sweep.py's base (vocab 8192, d_model 64, 4 layers, seq 256, batch 16, the
embedded corpus, validation every 25 steps) cut to --steps, at two learning rates x --runs/2 seeds. Prints the wall
and CPU time of each side and their ratio (the sides alternate over two halves of the seeds, --jobs 1, 2, 2, 1: a
ratio, not a timing to compare across machines), and the time from a run's process start to its first logged step,
as a share of a 60 s run. Run it on an idle machine: a run of 2 torch threads slows down far more than two runs of
one when other work takes a core.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT = """
import runpy
from ablate import grid, variant
base = variant(runpy.run_path({source!r})["base"], "base", {overrides!r})
runs = grid(base, {{"optim.lr": [1e-3, 3e-3]}})
seeds = list(range({seeds}))
"""
SMOKE = {  # a tiny model on a few documents: seconds, not minutes
    "model.vocab_size": 2048,
    "model.n_layers": 2,
    "data.max_documents": 300,
    "data.seq_len": 128,
}


def timed_run(exp: Path, out: Path, jobs: int, seeds: list[int], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process it started) of `ablate run --jobs N` on some seeds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    command = [sys.executable, "-m", "ablate", "run", str(exp), "--out", str(out), "--jobs", str(jobs)]
    result = subprocess.run([*command, "--seeds", ",".join(map(str, seeds))], env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"--jobs {jobs} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - start, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def launch_overhead(exp: Path, out: Path, env: dict) -> float:
    """Seconds from starting a worker process to its first step (imports, process group, data cache, model build,
    peak-FLOP/s lookup, first step): the time to its first metrics.jsonl line of training figures, less the steps
    between the first and that line, at the run's own speed."""
    from ablate.setup.experiment import load_experiment
    from ablate.rundir import run_dir_for

    run = load_experiment(exp, seeds=[99])[0]
    metrics = run_dir_for(out, run) / "metrics.jsonl"
    threads = max(1, (os.cpu_count() or 1))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate.launch.sweep", json.dumps(run.to_dict()), str(out), str(threads)],
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


def measure(work: Path, steps: int, runs: int, overrides: dict) -> dict:
    """Wall and CPU seconds of each side, and the launch overhead, everything written under `work`. The sides
    alternate over two halves of the seeds (--jobs 1, 2, 2, 1), so that a machine busier in one half than in the
    other weighs on both sides alike."""
    exp = work / "bench.py"
    source = str(REPO / "experiments" / "lr_batch_sweep.py")
    overrides = {**overrides, "train.max_steps": steps}
    seeds = list(range(runs // 2))  # 2 learning rates each; the sides alternate over two halves of them
    exp.write_text(EXPERIMENT.format(source=source, overrides=overrides, seeds=len(seeds)))
    env = {**os.environ, "ABLATE_CACHE": str(work / "cache")}
    env.pop("OMP_NUM_THREADS", None)
    # build the data cache and measure the peak FLOP/s at both thread counts, so both sides start equal
    from ablate.setup.experiment import load_experiment

    warm = load_experiment(exp, seeds=[98], overrides={"train.max_steps": "1"})[0].to_dict()
    cores = os.cpu_count() or 1
    for threads in sorted({cores, max(1, cores // 2)}):
        command = [sys.executable, "-m", "ablate.launch.sweep", json.dumps(warm), str(work / "warm"), str(threads)]
        subprocess.run(command, env=env, check=True, capture_output=True)
        shutil.rmtree(work / "warm")
    figures = {1: [0.0, 0.0], 2: [0.0, 0.0]}
    half = len(seeds) // 2
    for jobs, part in ((1, seeds[:half]), (2, seeds[:half]), (2, seeds[half:]), (1, seeds[half:])):
        wall, cpu = timed_run(exp, work / f"jobs{jobs}", jobs, part, env)
        figures[jobs][0] += wall
        figures[jobs][1] += cpu
    return {"jobs1": figures[1], "jobs2": figures[2], "launch": launch_overhead(exp, work / "launch", env)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--runs", type=int, default=8, help="runs a side: 2 learning rates x seeds (at least 4, even)")
    parser.add_argument("--smoke", action="store_true", help="4 tiny runs a side, 3 steps on 300 documents")
    args = parser.parse_args()
    overrides = {}
    if args.smoke:
        args.steps, args.runs, overrides = 3, 4, SMOKE
    if args.runs < 4 or args.runs % 2:
        parser.error(f"--runs {args.runs}: an even number of at least 4 (2 learning rates x 2 or more seeds)")
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: at least 1")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as work:
        found = measure(Path(work), args.steps, args.runs, overrides)
    (serial, serial_cpu), (side, side_cpu), overhead = found["jobs1"], found["jobs2"], found["launch"]
    print(
        f"{args.runs} runs x {args.steps} steps on {os.cpu_count()} cores; 1-minute load average {load:.2f} before "
        f"(other work shares the cores above ~0.5), {os.getloadavg()[0]:.2f} after (this script's runs count ~2)"
    )
    print(f"--jobs 1: {serial:.1f} s ({serial_cpu:.1f} CPU s)   --jobs 2: {side:.1f} s ({side_cpu:.1f} CPU s)")
    print(f"ratio wall time --jobs 1 / --jobs 2: {serial / side:.2f}x")
    print(f"launch overhead (process start to first step): {overhead:.1f} s = {100 * overhead / 60:.1f}% of a 60 s run")


if __name__ == "__main__":
    main()
