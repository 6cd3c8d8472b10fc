"""`ablate plan FILE`: parameters, FLOPs, tokens, per-rank memory and time of every run, before any compute; runs
that cannot fit the device memory are refused (exit 2). `--stack K` (or the file's `stack`, as `ablate run` takes
it): the runs in stacks of up to K, as `ablate run` trains them, each stack's memory on its one device and the
largest stack of its shape that fits; a stack that cannot fit is refused."""

from __future__ import annotations

from ablate.cli.options import DEVICE_MEMORY, RUNS_ROOT, WHOLE_1, add_run_selection, one_of
from ablate.config import ConfigError
from ablate.setup.overrides import parse_set_args


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="what each run costs (parameters, FLOPs, tokens, per-rank memory, time) before "
        "any compute; refuses runs that cannot fit the device memory",
    )
    add_run_selection(parser, "variant names or globs, comma-separated or repeated", "train.micro_batch=8")
    parser.add_argument(
        "--world-size", type=WHOLE_1, default=1, metavar="N", help="ranks FSDP2 shards over (default 1)"
    )
    parser.add_argument(
        "--stack",
        type=WHOLE_1,
        metavar="K",
        help="plan runs of one shape in stacks of up to K, each one model on one device (as ablate run --stack K): "
        "each stack's memory and the largest K that fits (default: the file's `stack`, else 1: every run alone)",
    )
    parser.add_argument(
        "--device-memory",
        metavar="SIZE",
        type=DEVICE_MEMORY,
        help="memory per device, e.g. 24GiB or 80GB (default: the visible GPU's, else no check)",
    )
    parser.add_argument(
        "--dtype", type=one_of("auto", "fp32", "bf16"), metavar="auto|fp32|bf16", help="override train.dtype"
    )
    parser.add_argument(
        "--out", default="runs", type=RUNS_ROOT, help="runs root whose finished runs give the MFU (default: runs/)"
    )
    parser.set_defaults(func=cmd_plan)


def cmd_plan(args) -> int:
    from ablate.cost import memory, plan  # torch: imported only when the command runs
    from ablate.setup.experiment import load_checked

    overrides = parse_set_args(args.set)
    if args.dtype:
        overrides["train.dtype"] = args.dtype
    runs = load_checked(args.file, only=args.only, seeds=args.seeds, overrides=overrides)
    stack = _stack_size(args)
    device_memory = memory.parse_size(args.device_memory) if args.device_memory else memory.device_memory_default()
    plans = [plan.plan_run(run, args.world_size) for run in runs]
    mfu, mfu_source = plan.earlier_mfu(args.out, runs[0].config.experiment)
    print(plan.format_report(plans, args.world_size, device_memory, mfu, mfu_source), flush=True)
    if stack > 1:
        return _plan_stacks(runs, stack, device_memory)
    unfit = plan.unfit(plans, device_memory)
    if unfit:
        raise ConfigError(memory.refusal(unfit, args.world_size, device_memory))
    return 0


def _stack_size(args) -> int:
    """--stack, else the file's `stack` (what `ablate run` would stack by), else 1; refused over several ranks."""
    from ablate.setup.experiment import experiment_stack

    size = args.stack or experiment_stack(args.file)
    if size > 1 and args.world_size > 1:
        given = f"--stack {size}" if args.stack else f"the file's stack = {size}"
        raise ConfigError(
            f"{given} with --world-size {args.world_size}: a stack trains on one device (world size 1); allowed: "
            f"--stack K at --world-size 1, or --stack 1 at any world size"
        )
    return size


def _plan_stacks(runs, size: int, device_memory: int | None) -> int:
    """The stacks' table; refuses the stacks that cannot fit (a run that cannot fit alone is in one of them: a
    stack needs at least what each of its members needs)."""
    from ablate.cost import plan

    stacks, alone = plan.plan_stacks(runs, size, device_memory)
    print(plan.format_stacks(stacks, alone, size, device_memory), flush=True)
    unfit = plan.unfit_stacks(stacks, device_memory)
    if unfit:
        raise ConfigError(plan.stack_refusal(unfit, device_memory))
    return 0
