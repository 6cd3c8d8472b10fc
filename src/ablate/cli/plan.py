"""`ablate plan FILE`: parameters, FLOPs, tokens, per-rank memory and time of every run, before any compute; runs
that cannot fit the device memory are refused (exit 2)."""

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
    device_memory = memory.parse_size(args.device_memory) if args.device_memory else memory.device_memory_default()
    plans = [plan.plan_run(run, args.world_size) for run in runs]
    mfu, mfu_source = plan.earlier_mfu(args.out, runs[0].config.experiment)
    print(plan.format_report(plans, args.world_size, device_memory, mfu, mfu_source), flush=True)
    unfit = plan.unfit(plans, device_memory)
    if unfit:
        raise ConfigError(memory.refusal(unfit, args.world_size, device_memory))
    return 0
