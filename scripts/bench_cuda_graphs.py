"""ablate's step replayed from CUDA graphs (train.cuda_graphs=True) against the same step un-graphed, in one process.

    python scripts/bench_cuda_graphs.py                       # a GPU: ~10M and GPT-2 small, compiled and eager
    python scripts/bench_cuda_graphs.py --shapes 10M --compile false
    python scripts/bench_cuda_graphs.py --smoke               # CPU, a toy model: the static step without capture
    python scripts/bench_cuda_graphs.py --shapes --stacks quickstart:8   # stacks only (size:K, eager)

Per shape, two real steps (the Trainer as `ablate run` builds it, default callbacks, the same seed and data): one
with train.cuda_graphs=True, one with False. First the equality: --check steps on each from the same start, every
step's loss and grad norm read after it; they must be equal bit for bit (the graphed side's first steps are its
eager warm-up, training.graphs.EAGER_STEPS_BEFORE_CAPTURE, the rest replays). Then the time: blocks of steps
alternate between the sides, each side's ms a step the median over its blocks. On CPU (--smoke) the graphed side is
the static step run without capture (a capture needs CUDA): the script's every line runs, its figures mean nothing.
Then, per --stacks size:K, the same for a stack of K seeds (training.stack.StackedTrainer, eager: its graphs are
training.graphs.StackGraphs): every member's loss and grad norm bit for bit, then the stacked step's time.
Verdict lines start with PASS, FAIL or INFO; each shape ends with `ratio step time un-graphed / graphed, SHAPE: X.XXx`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_acceptance_measure as measure  # noqa: E402


def sides(shape: str, device: str, compile_setting: bool | str):
    """(un-graphed, graphed) RealSteps of `shape`, built alike but for train.cuda_graphs."""
    import torch

    from ablate.setup.overrides import apply_overrides
    from ablate.training.graphs import StepGraphs

    d = measure.device_setup(device)
    run = measure.run_config(measure.SPECS[shape], d.device, compile=compile_setting)
    on_gpu = d.device.type == "cuda"
    built = []
    for graphed in (False, True):
        fields = {"train.cuda_graphs": graphed and on_gpu}
        built.append(measure.RealStep(apply_overrides(run, fields), d))
    if not on_gpu:  # no capture without CUDA: the same static step, eagerly
        built[1].trainer.graphs = StepGraphs(built[1].trainer, capture=False)
    assert built[1].trainer.graphs is not None, "train.cuda_graphs=True gave no graphs"
    torch.manual_seed(0)
    return built


def measure_shape(shape: str, device: str, compile_setting, check_steps: int, blocks: int, block_steps: int) -> float:
    plain, graphed = sides(shape, device, compile_setting)
    label = f"{measure.SPECS[shape].name}, compile={compile_setting}"
    mismatch = None
    for step in range(check_steps):
        plain.step()
        graphed.step()
        a = (plain.trainer.last_loss, plain.trainer.last_grad_norm)
        b = (graphed.trainer.last_loss, graphed.trainer.last_grad_norm)
        if a != b and mismatch is None:
            mismatch = f"step {step + 1}: loss, grad norm {a} un-graphed, {b} graphed"
    replayed = graphed.trainer.graphs.captures > 0  # the check's last steps came from graphs
    measure.say(
        measure.judge(mismatch is None and replayed, device == "cuda"),
        f"graphed losses bit for bit the un-graphed ones, {label}",
        mismatch or f"{check_steps} steps equal ({graphed.trainer.graphs.captures} capture)",
    )
    times = {"un-graphed": [], "graphed": []}
    for _ in range(blocks):
        for name, real in (("un-graphed", plain), ("graphed", graphed)):
            times[name].append(real.timed(block_steps) / block_steps)
    ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    ratio = ms["un-graphed"] / ms["graphed"]
    measure.say("info", f"step time, {label}", f"un-graphed {ms['un-graphed']:.2f} ms, graphed {ms['graphed']:.2f} ms")
    print(f"ratio step time un-graphed / graphed, {label}: {ratio:.2f}x", flush=True)
    plain.close()
    graphed.close()
    return ratio


def stack_sides(size: str, device: str, members: int) -> list[tuple]:
    """(un-graphed, graphed) stacks of `members` seeds of `size` (bench_stack's runs, eager), built alike but for
    train.cuda_graphs: (StackedTrainer, its members' RealSteps) each."""
    import bench_stack

    from ablate.setup.overrides import apply_overrides
    from ablate.training.graphs import StackGraphs
    from ablate.training.stack import StackedTrainer

    d, on_gpu = measure.device_setup(device), device == "cuda"
    bench_stack.COMPILE = False
    built = []
    for graphed in (False, True):
        fields = {"train.cuda_graphs": graphed and on_gpu}
        reals = [
            measure.RealStep(apply_overrides(bench_stack.run_config(size, device, seed=seed), fields), d)
            for seed in range(members)
        ]
        stacked = StackedTrainer([real.trainer for real in reals])
        if graphed and not on_gpu:  # no capture without CUDA: the same static step, eagerly
            stacked.graphs = StackGraphs(stacked, capture=False)
        built.append((stacked, reals))
    assert built[1][0].graphs is not None, "train.cuda_graphs=True gave the stack no graphs"
    return built


def measure_stack(size: str, members: int, device: str, check_steps: int, blocks: int, block_steps: int) -> float:
    (plain, plain_reals), (graphed, graphed_reals) = stack_sides(size, device, members)
    label = f"a stack of {members}, {size}, eager"
    mismatch = None
    for step in range(check_steps):
        plain.train_step()
        graphed.train_step()
        a = [(m.last_loss, m.last_grad_norm) for m in plain.members]
        b = [(m.last_loss, m.last_grad_norm) for m in graphed.members]
        if a != b and mismatch is None:
            mismatch = f"step {step + 1}: losses, grad norms {a} un-graphed, {b} graphed"
    captures = graphed.graphs.captures
    measure.say(
        measure.judge(mismatch is None and captures > 0 and not graphed.failed, device == "cuda"),
        f"graphed stack's losses bit for bit the un-graphed stack's, {label}",
        mismatch or f"{check_steps} steps equal ({captures} capture, {len(graphed.failed)} masked)",
    )
    times = {"un-graphed": [], "graphed": []}
    d = measure.device_setup(device).device
    for _ in range(blocks):
        for name, stacked in (("un-graphed", plain), ("graphed", graphed)):
            times[name].append(measure.timed_steps(stacked.train_step, d, block_steps) / block_steps)
    ms = {name: statistics.median(values) * 1e3 for name, values in times.items()}
    ratio = ms["un-graphed"] / ms["graphed"]
    measure.say("info", f"step time, {label}", f"un-graphed {ms['un-graphed']:.2f} ms, graphed {ms['graphed']:.2f} ms")
    print(f"ratio step time un-graphed / graphed, {label}: {ratio:.2f}x", flush=True)
    for real in plain_reals + graphed_reals:
        real.close()
    return ratio


def stack_plan(text: str) -> tuple[str, int]:
    """--stacks' SIZE:K, e.g. quickstart:8."""
    size, _, members = text.partition(":")
    sizes = ["quickstart", *sorted(measure.SPECS)]
    if size not in sizes or not members.isdigit() or int(members) < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: SIZE:K with SIZE one of {sizes} and K >= 1")
    return size, int(members)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="*", default=["10M", "gpt2"], choices=sorted(measure.SPECS))
    parser.add_argument(
        "--stacks", nargs="*", type=stack_plan, default=[("quickstart", 8), ("10M", 4)], help="size:K, eager stacks"
    )
    parser.add_argument("--compile", nargs="+", default=["true", "false"], choices=["true", "false", "auto"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--check", type=int, default=10, help="steps compared bit for bit")
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--block-steps", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="a toy model on CPU, a few steps: that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.shapes, args.compile, args.device, args.check, args.blocks, args.block_steps = (
            ["smoke"],
            ["false"],
            "cpu",
            6,
            2,
            2,
        )
        args.stacks = [("quickstart", 2)]
    for shape in args.shapes:
        for setting in args.compile:
            compile_setting = {"true": True, "false": False}.get(setting, setting)
            measure_shape(shape, args.device, compile_setting, args.check, args.blocks, args.block_steps)
    for size, members in args.stacks:
        measure_stack(size, members, args.device, args.check, args.blocks, args.block_steps)


if __name__ == "__main__":
    main()
