"""`ablate` command line: thin wrappers over library calls.

Under torchrun every rank runs the same command; rank 0 prints.
"""
from __future__ import annotations

import argparse
import sys

from ablate.config import ConfigError, parse_set_args


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,1,2; got {text!r}") from None


def cmd_run(args) -> int:
    from ablate.experiment import load_experiment
    from ablate.parallel import shutdown_distributed
    from ablate.train import run_dir_for, train

    only = [x.strip() for x in args.only.split(",")] if args.only else None
    runs = load_experiment(args.file, only=only, seeds=args.seeds, overrides=parse_set_args(args.set))
    import torch.distributed as dist

    results = []
    try:
        for run in runs:
            summary = train(run, args.out)
            results.append((run, summary))
            if dist.get_rank() == 0:
                print(f"done {run.name} seed{run.train.seed}: {run_dir_for(args.out, run)}  "
                      f"final_loss {summary['final_loss']:.4f}  final_val_loss {summary['final_val_loss']:.4f}  "
                      f"{summary['tokens_per_second']:.0f} tok/s  {summary['wall_seconds']:.1f}s", flush=True)
    finally:
        shutdown_distributed()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ablate", description="Pre-training ablations: train variants, compare them.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train every variant x seed of an experiment file")
    run.add_argument("file", help="experiment file (Python) defining `runs`")
    run.add_argument("--only", help="comma-separated variant names to run")
    run.add_argument("--seeds", type=_int_list, help="comma-separated seeds, overriding the file's `seeds`")
    run.add_argument("--out", default="runs", help="runs root (default: runs/)")
    run.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                     help="override a config field, e.g. --set train.max_steps=20 (repeatable)")
    run.set_defaults(func=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ablate.experiment import ExperimentError

    try:
        return args.func(args)
    except (ConfigError, ExperimentError) as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
