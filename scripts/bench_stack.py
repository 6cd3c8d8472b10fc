"""Stacked runs against the other ways to train K runs of one shape: aggregate training tokens per second.

    python scripts/bench_stack.py                                          # CPU: the quickstart's baseline, K = 1-4
    python scripts/bench_stack.py --device cuda --sizes 10M quickstart --members 1 2 4 8 16
    python scripts/bench_stack.py --optim muon --members 1 3               # Muon: its Newton-Schulz batched
    python scripts/bench_stack.py --ops --members 1 2 4 8                   # torch ops a step (~launches on a GPU)

For each size and K, every side is ablate's real step (the Trainer as `ablate run` builds it, default callbacks,
train.dtype at its default: fp32 on CPU, bf16 on a GPU; train.compile as --compile says, "auto" by default: eager
on CPU, and on a GPU for runs too short to repay a compile):
    one after another   one run of batch B; K such runs in sequence train at its tokens/s
    K x batch           one run of batch K*B: the most the device gives that shape, the target's yardstick
    stacked             K runs (seeds 0..K-1) as one stack (training.stack.StackedTrainer)
    side by side        K processes, each one run of batch B, timed together after every one has warmed up
The in-process sides are timed in two interleaved halves after their warm-up steps (the compiles), so drift hits
them alike; side by side runs after them. Sizes: `quickstart` (experiments/quickstart.py's baseline: 0.4M
parameters, 32 x 128 tokens a step) and `10M` (d256, 6 layers, vocab 16384, 32 x 512; the acceptance's ~10M).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
LONG_RUN_STEPS = 10_000  # no measured step is near a run's last (its validation and checkpoint)


COMPILE = "auto"  # train.compile of every side (--compile)
OPTIMIZER = "adamw"  # optim.name of every side (--optim)


def run_config(size: str, device: str, batch: int | None = None, seed: int = 0):
    """The RunConfig of `size` at its default batch or `batch` sequences a step (one pass), seed `seed`."""
    import gpu_acceptance_measure as measure

    from ablate.setup.experiment import load_experiment
    from ablate.setup.overrides import apply_overrides

    if size == "quickstart":
        run = load_experiment(REPO / "experiments" / "quickstart.py", only=["baseline"])[0]
    else:
        run = measure.run_config(measure.SPECS[size], measure.device_setup(device).device, dtype="auto")
    batch = batch or run.train.global_batch
    fields = {"train.global_batch": batch, "train.micro_batch": batch, "train.seed": seed, "train.device": device}
    fields["train.compile"], fields["optim.name"] = COMPILE, OPTIMIZER
    quiet = {"train.max_steps": LONG_RUN_STEPS, "train.val_every": 0, "train.ckpt_every": 0}
    return apply_overrides(run, {**quiet, **fields})


def real_step(size: str, device: str, batch: int | None = None, seed: int = 0):
    import gpu_acceptance_measure as measure

    return measure.RealStep(run_config(size, device, batch, seed), measure.device_setup(device))


def in_process(size: str, members: int, steps: int, warmup: int, device: str) -> dict[str, float]:
    """tokens/s of one run, one run at K times its batch, and K stacked runs, interleaved in this process."""
    import gpu_acceptance_measure as measure
    import torch

    from ablate.training.stack import StackedTrainer

    lone = real_step(size, device)
    big = real_step(size, device, batch=lone.tokens_per_step // lone.trainer.seq_len * members) if members > 1 else lone
    member_steps = [real_step(size, device, seed=seed) for seed in range(members)]
    stacked = StackedTrainer([m.trainer for m in member_steps])
    sides = {
        "one after another": (lone.step, 1),
        "K x batch": (big.step, members),
        "stacked": (stacked.train_step, members),
    }
    if members == 1:
        del sides["K x batch"]  # it is the lone run
    for step, _ in sides.values():
        for _ in range(warmup):
            step()
    seconds = dict.fromkeys(sides, 0.0)
    for _ in range(2):  # interleaved halves
        for name, (step, _) in sides.items():
            seconds[name] += measure.timed_steps(step, torch.device(device), steps)
    for real in {id(r): r for r in [lone, big, *member_steps]}.values():
        real.close()
    return {name: lone.tokens_per_step * runs * 2 * steps / seconds[name] for name, (_, runs) in sides.items()}


@contextlib.contextmanager
def _native_stderr_silenced():
    """The profiler's C++ side (kineto) writes a line to file descriptor 2 at each start and stop: it is sent to
    /dev/null for the block, as Python's redirect_stderr cannot."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def ops_per_step(size: str, members: int, device: str) -> dict[str, int]:
    """The torch operators one stacked step of K members dispatches (the profiler's aten calls, nested ones
    included), after a warm-up step: on a GPU, about its kernel launches. Against the lone run's, this shows what
    still runs member by member (it grows with K) and what runs once for the stack."""
    from torch.profiler import profile

    from ablate.training.stack import StackedTrainer

    lone = real_step(size, device)
    member_steps = [real_step(size, device, seed=seed) for seed in range(members)]  # at one step: stacked
    stacked = StackedTrainer([m.trainer for m in member_steps])
    counts = {}
    for name, step in (("lone", lone.step), ("stacked", stacked.train_step)):
        step()
        with _native_stderr_silenced(), profile() as profiled:
            step()
        counts[name] = sum(e.count for e in profiled.key_averages() if e.key.startswith("aten::"))
    for real in [lone, *member_steps]:
        real.close()
    return counts


def _side_by_side_worker(size, device, seed, threads, steps, warmup, barrier, results, settings):
    global COMPILE, OPTIMIZER
    import torch

    COMPILE, OPTIMIZER = settings  # a spawned process imports this module afresh
    torch.set_num_threads(threads)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        real = real_step(size, device, seed=seed)
        for _ in range(warmup):
            real.step()
        import gpu_acceptance_measure as measure

        measure.synchronize(torch.device(device))
        barrier.wait()  # every process warmed up (compiled) before any is timed
        start = time.monotonic()  # system-wide: comparable across the processes
        for _ in range(steps):
            real.step()
        measure.synchronize(torch.device(device))
        results.put((start, time.monotonic(), real.tokens_per_step * steps))
        real.close()


def side_by_side(size: str, members: int, steps: int, warmup: int, device: str) -> float:
    """Aggregate tokens/s of K processes, each one run, from the first one's timed start to the last one's end."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(members), context.Queue()
    threads = max(1, (os.cpu_count() or 1) // members)  # the CPU's cores split between the processes
    workers = [
        context.Process(
            target=_side_by_side_worker,
            args=(size, device, seed, threads, 2 * steps, warmup, barrier, results, (COMPILE, OPTIMIZER)),
        )
        for seed in range(members)
    ]
    for worker in workers:
        worker.start()
    spans = [results.get(timeout=1800) for _ in workers]
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise RuntimeError(f"bench_stack: a side-by-side process exited with {worker.exitcode}")
    return sum(tokens for _, _, tokens in spans) / (max(end for _, end, _ in spans) - min(s for s, _, _ in spans))


def main(argv: list[str] | None = None) -> None:
    global COMPILE, OPTIMIZER
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["quickstart"], choices=["quickstart", "10M"])
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per half")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-processes", action="store_true", help="skip the side-by-side processes")
    parser.add_argument("--compile", default="auto", choices=["auto", "true", "false"], help="train.compile, all sides")
    parser.add_argument("--optim", default="adamw", choices=["adamw", "muon"], help="optim.name, all sides")
    parser.add_argument("--ops", action="store_true", help="torch ops per stacked step for each K (no timing)")
    parser.add_argument("--smoke", action="store_true", help="K = 1, 2, one timed step: that the script runs")
    args = parser.parse_args(argv)
    COMPILE, OPTIMIZER = {"true": True, "false": False}.get(args.compile, args.compile), args.optim
    if args.smoke:
        args.members, args.steps, args.warmup = [1, 2], 1, 1
    if args.ops:
        print(f"{'size':<10} K   {'ops, lone step':>15} {'ops, stacked step':>18}  stacked / (K x lone)", flush=True)
        for size in args.sizes:
            for k in args.members:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    ops = ops_per_step(size, k, args.device)
                share = ops["stacked"] / (k * ops["lone"])
                print(f"{size:<10} {k:<3} {ops['lone']:>15,} {ops['stacked']:>18,}  {share:.2f}", flush=True)
        return
    columns = ["one after another", "K x batch", "stacked", "side by side"]
    print(f"{'size':<10} K   " + "  ".join(f"{c:>17}" for c in columns) + "  stacked / each other side", flush=True)
    for size in args.sizes:
        for k in args.members:
            runs_own_lines = io.StringIO()  # the runs' data and last-step lines, not the benchmark's
            with contextlib.redirect_stdout(runs_own_lines), contextlib.redirect_stderr(runs_own_lines):
                rates = in_process(size, k, args.steps, args.warmup, args.device)
            if not args.no_processes and k > 1:
                rates["side by side"] = side_by_side(size, k, args.steps, args.warmup, args.device)
            cells = "  ".join(f"{rates[c]:>17,.0f}" if c in rates else f"{'-':>17}" for c in columns)
            ratios = ", ".join(
                f"{rates['stacked'] / rates[c]:.2f}x" if c in rates else "-" for c in columns if c != "stacked"
            )
            print(f"{size:<10} {k:<3} {cells}  {ratios}", flush=True)
    print(f"ratio tokens/s stacked / one after another, K={k}: {rates['stacked'] / rates['one after another']:.2f}x")


if __name__ == "__main__":
    main()
