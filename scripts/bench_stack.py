"""Stacked runs against the same runs one after another: aggregate training tokens per second, in one process.

    python scripts/bench_stack.py                    # the quickstart's baseline, K = 1, 2, 3, 4 seeds, CPU
    python scripts/bench_stack.py --members 1 2 4 8 16 --steps 10 --device cuda

For each K: K ordinary Trainers of experiments/quickstart.py's baseline (seeds 0..K-1), stepped (a) one after
another, each its own model, and (b) as one stack (training.stack.StackedTrainer: one vmapped forward and backward
for all K), interleaved twice so drift hits both sides; tokens/s of each and the ratio (b) / (a). Warm-up steps are
not timed. The stack runs the model's eager fp32 loss (compile and bf16 under vmap are not built yet), so both sides
run eager and fp32 here, on a GPU too. Not measured yet: K processes side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def trainers(root: Path, members: int, steps: int, device: str) -> list:
    from ablate.setup.checks import check_run
    from ablate.setup.experiment import load_experiment
    from ablate.setup.overrides import apply_overrides
    from ablate.training.parallel import init_distributed
    from ablate.training.trainer import Trainer

    quiet = {"train.max_steps": steps, "train.log_every": 1000, "train.val_every": 0, "train.ckpt_every": 0}
    out = []
    for seed in range(members):
        run = load_experiment(REPO / "experiments" / "quickstart.py", only=["baseline"])[0]
        same_footing = {"train.compile": False, "train.dtype": "fp32"}  # what a stack runs today: eager, fp32
        run = apply_overrides(run, {**quiet, **same_footing, "train.seed": seed, "train.device": device})
        d = init_distributed(run.train.device)
        folder = root / f"seed{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        trainer = Trainer(check_run(run, d.world), folder, d)
        trainer.start_time = 0.0
        trainer.channel.open(0)
        trainer.begin()
        out.append(trainer)
    return out


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def tokens_per_second(step, tokens_per_step: int, steps: int, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return tokens_per_step * steps / (time.perf_counter() - start)


def measure(members: int, steps: int, warmup: int, device: str) -> tuple[float, float]:
    from ablate.training.stack import StackedTrainer

    with tempfile.TemporaryDirectory() as tmp:
        lone = trainers(Path(tmp) / "lone", members, warmup + 2 * steps, device)
        stacked = StackedTrainer(trainers(Path(tmp) / "stack", members, warmup + 2 * steps, device))
        per_step = lone[0].batch_plan[0] * lone[0].seq_len * members

        def one_after_another():
            for trainer in lone:
                trainer.train_step()

        for _ in range(warmup):
            one_after_another()
            stacked.train_step()
        alone, together = [], []
        for _ in range(2):  # interleaved halves
            alone.append(tokens_per_second(one_after_another, per_step, steps, device))
            together.append(tokens_per_second(stacked.train_step, per_step, steps, device))
        for trainer in [*lone, *stacked.members]:
            trainer.end()
    return sum(alone) / 2, sum(together) / 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per half")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--smoke", action="store_true", help="K = 1, 2, one timed step: that the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.members, args.steps, args.warmup = [1, 2], 1, 1
    print("K  one after another tok/s  stacked tok/s  stacked / one after another")
    for k in args.members:
        runs_own_lines = io.StringIO()  # the runs' data and last-step lines, not the benchmark's
        with contextlib.redirect_stdout(runs_own_lines), contextlib.redirect_stderr(runs_own_lines):
            alone, together = measure(k, args.steps, args.warmup, args.device)
        print(f"{k:<2} {alone:>24,.0f}  {together:>13,.0f}  {together / alone:.2f}x", flush=True)
    print(f"ratio tokens/s stacked / one after another, K={k}: {together / alone:.2f}x")


if __name__ == "__main__":
    main()
