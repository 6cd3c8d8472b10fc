"""The `ablate` command: this top-level parser, and one module per subcommand that adds its own arguments and
holds its handler (run, plan, status, eval, export, report, tokenizer); `ablate-lm-eval` is cli/lm_eval.py. The
values each option accepts are rules in cli/options.py.

Every command module is imported to build the parser, so each imports torch (and numpy) only inside its handler:
`ablate status` and `ablate report` start quickly. Under torchrun every rank runs the same command; rank 0 prints.
"""

from __future__ import annotations

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
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ExperimentError, RunFolderError) as exc:
        print(f"ablate: error: {exc}", file=sys.stderr)
        return 2


__all__ = ["main"]
