"""The `ablate` command: this top-level parser, and one module per subcommand that adds its own arguments and
holds its handler (run, plan, status, eval, export, report, tokenizer); `ablate-lm-eval` is cli/lm_eval.py. The
values each option accepts are rules in cli/options.py.

Every command module is imported to build the parser, so each imports torch (and numpy) only inside its handler:
`ablate status` and `ablate report` start quickly. Under torchrun every rank runs the same command; rank 0 prints.
"""

from __future__ import annotations

import gc
import sys

from ablate.cli import eval as eval_command
from ablate.cli import export, plan, report, run, status, tokenizer
from ablate.cli.options import Parser
from ablate.config import ConfigError, ExperimentError
from ablate.rundir import RunFolderError

COMMANDS = (run, plan, status, eval_command, export, report, tokenizer)  # in the order `ablate --help` lists them


def build_parser() -> Parser:
    parser = Parser(prog="ablate", description="Pre-training ablations: train variants, compare them.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_command(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Parsing imports torch (`--out`'s check loads ablate.setup): ~300k objects that all stay, which the collector's
    # full collections, as they came, walked again and again to free nothing (5 of them, ~0.25 s on a 2-core CPU).
    # `ablate run` then keeps them out of each run's collections (launch.sweep.survivors_frozen).
    collecting = gc.isenabled()
    gc.disable()
    try:
        args = build_parser().parse_args(argv)
    finally:
        if collecting:
            gc.enable()
    try:
        code = args.func(args)
    except (ConfigError, ExperimentError, RunFolderError) as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        code = 2
    return code


__all__ = ["main"]
