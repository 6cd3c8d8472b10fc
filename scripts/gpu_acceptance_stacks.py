"""The acceptance's stack, CUDA-graph and stacked-eval measurements (scripts/gpu_acceptance.py parts 4 and 5), one
process each."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_measure as measure  # noqa: E402

REPO = measure.REPO
say, judge = measure.say, measure.judge


def stack_bench_plans(smoke: bool) -> list[tuple[str, int, bool | str]]:
    """stack_bench's rows: (size, K, train.compile) each."""
    sizes = ("quickstart",) if smoke else ("10M", "quickstart")
    plans = [(size, k, "auto") for size in sizes for k in ((1, 2) if smoke else (1, 2, 3, 4, 8, 16))]
    return plans + ([] if smoke else [("10M", k, True) for k in (4, 8)])


def step_stack_bench(smoke: bool) -> None:
    """bench_stack.py's sides in this process, a line per size and K; a row that fails (a stack whose members all
    diverged, say) is said as a failure and the others go on."""
    import bench_stack

    device = "cpu" if smoke else "cuda"
    steps, warmup = (1, 1) if smoke else (5, 3)
    for size, k, compile_setting in stack_bench_plans(smoke):
        bench_stack.COMPILE = compile_setting
        check = f"stack of {k}, {size}, train.compile={compile_setting}"
        try:
            rates = bench_stack.in_process(size, k, steps, warmup, device)
            if k in (2, 4) and compile_setting == "auto":
                rates["side by side"] = bench_stack.side_by_side(size, k, steps, warmup, device)
        except Exception as exc:
            say(judge(False, not smoke), check, f"{type(exc).__name__}: {str(exc)[:300]}")
            continue
        figures = ", ".join(f"{name} {rate:,.0f} tok/s" for name, rate in rates.items())
        if k == 1:
            say("info", check, figures)
            continue
        big, by_side = rates["stacked"] / rates["K x batch"], rates.get("side by side")
        ok = big >= 0.9 and (by_side is None or rates["stacked"] > by_side)
        versus = f"; {rates['stacked'] / by_side:.2f}x side by side" if by_side else ""
        say(judge(ok, not smoke), f"{check}: >= 90% of one run at K x batch", f"{big:.2f}x{versus} ({figures})")


def step_quickstart_stacked(smoke: bool) -> None:
    """`ablate run experiments/quickstart.py --stack 3` in a fresh process, as a user starts it; the training time is
    each stack's wall time (its members', summary.json's wall_seconds), summed over the stacks."""
    # the smoke: one variant's 3 seeds, 2 steps each, on CPU (that the step runs, not its figure)
    settings = ["--only", "baseline", "--set", "train.max_steps=2"] if smoke else ["--set", "train.device=cuda"]
    with tempfile.TemporaryDirectory(prefix="gpu_acceptance_quickstart_") as tmp:
        command = [sys.executable, "-m", "ablate", "run", str(REPO / "experiments" / "quickstart.py"), "--stack", "3"]
        start = time.time()
        done = subprocess.run([*command, *settings, "--out", tmp], capture_output=True, text=True, cwd=REPO)
        elapsed = time.time() - start
        if done.returncode != 0:
            say(judge(False, not smoke), "the quickstart as 3 stacks", done.stderr[-500:] or done.stdout[-500:])
            return
        stacks: dict[str, float] = {}
        for path in Path(tmp).glob("quickstart/*/seed*/summary.json"):
            summary = json.loads(path.read_text())
            stacks[summary["variant"]] = max(stacks.get(summary["variant"], 0.0), summary["wall_seconds"])
    training = sum(stacks.values())
    say(
        judge(training <= 10 and len(stacks) == 3, not smoke),
        "the quickstart's 9 runs as 3 stacks, training <= 10 s",
        f"{training:.1f} s of training over {len(stacks)} stacks ({elapsed:.1f} s for the whole command)",
    )


def step_cuda_graphs(smoke: bool) -> None:
    """scripts/bench_cuda_graphs.py in this process: its verdict lines are the step's."""
    import bench_cuda_graphs

    bench_cuda_graphs.main(["--smoke"] if smoke else ["--device", "cuda"])


def step_stack_eval(smoke: bool) -> None:
    """scripts/bench_stack_eval.py in this process: its verdict lines are the step's."""
    import bench_stack_eval

    bench_stack_eval.main(["--smoke"] if smoke else ["--device", "cuda"])


def step_stack_k3(smoke: bool) -> None:
    """Stacks of 3 (~10M, bf16, eager, the torch references under vmap) where the 2026-11-28 lease saw every member
    masked as diverged within 8 steps: in a fresh process, after a stack of 8 (that lease ran K = 8 first in the
    same process: the free memory, and so the loss's chunk count, differ), and at chunk counts 1, 4 and 7. Each
    says every member's loss and grad norm finite or the first step that was not, and the chunk count it ran."""
    import bench_stack

    from ablate.training.stack import StackedTrainer

    size, device, steps = ("quickstart", "cpu", 2) if smoke else ("10M", "cuda", 8)
    bench_stack.COMPILE = False
    cases = [("fresh", 3, None), ("after a stack of 8", 8, None), ("after a stack of 8", 3, None)]
    cases += [(f"{chunks} loss chunks", 3, chunks) for chunks in (1, 4, 7)]
    for label, k, chunks in cases:
        reals = [bench_stack.real_step(size, device, seed=seed) for seed in range(k)]
        stacked = StackedTrainer([real.trainer for real in reals])
        if chunks is not None:
            stacked.stack.loss_module.model.loss_chunks = chunks
        bad = None
        for step in range(steps):
            stacked.train_step()
            live = [stacked.members[i] for i in stacked.live]
            figures = [(m.last_loss, m.last_grad_norm) for m in live]
            if (stacked.failed or not all(map(math.isfinite, sum(figures, ())))) and bad is None:
                bad = f"step {step + 1}: {figures}, masked {sorted(stacked.failed)}"
        ran = stacked.stack.loss_module.model.loss_chunks
        if label != "after a stack of 8" or k == 3:
            figure = bad or f"{steps} steps finite ({ran} chunks)"
            say(judge(bad is None, not smoke), f"a stack of {k}, {label}", figure)
        for real in reals:
            real.close()
