"""The values each option of the `ablate` command accepts: every option's argparse type is a rule here, so a wrong
value stops the command in one line, `ablate: error: --option VALUE: allowed: ...`, exit 2, before anything is read,
computed or written.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from ablate.config import ConfigError
from ablate.setup.overrides import parse_set_args


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line without the usage block (--help still prints it)."""

    def error(self, message):
        head, sep, rest = message.partition(": ")
        if sep and head.startswith("argument "):  # argparse's "argument --limit: <what the rule said>"
            option = head.removeprefix("argument ").split("/")[-1]
            if rest.startswith(option):  # a library check that names the option itself
                message = rest
            else:
                message = f"{option} {rest}" if "allowed: " in rest else f"{option}: {rest}"
        else:
            message = f"{message} (see {self.prog} --help)"
        self.exit(2, f"ablate: error: {message}\n")


def one_line_errors(handler):
    """A command handler whose library refusals (unknown task, bad format, not a run, unexportable model) end the
    command as a wrong value does: one line, `ablate: error: ...`, exit 2 (`ablate eval`, `ablate export`)."""

    def wrapped(args) -> int:
        try:
            return handler(args)
        except (ValueError, FileNotFoundError, ModuleNotFoundError, NotImplementedError) as exc:
            raise ConfigError(str(exc)) from exc

    return wrapped


class _Why(ValueError):
    """A value refused for a reason the rule's allowed values do not say (e.g. no GPU here)."""


def rule(convert, allowed: str):
    """An argparse type: convert(text) returns the value or raises ValueError; the refusal reads
    `VALUE: [why; ]allowed: ALLOWED` and the parser puts the option in front of it."""

    def check(text: str):
        try:
            return convert(text)
        except _Why as exc:
            why = f"{exc}; "
        except ValueError:
            why = ""
        raise argparse.ArgumentTypeError(f"{text if text.strip() else repr(text)}: {why}allowed: {allowed}")

    return check


def number(
    kind: type,
    low: float,
    high: float | None = None,
    open_low: bool = False,
    open_high: bool = False,
    noun: str | None = None,
):
    """A finite int or float within bounds: number(float, 0, 1, True, True) is the open interval (0, 1)."""

    def convert(text: str):
        value = kind(text)
        if not (
            math.isfinite(value)
            and (value > low if open_low else value >= low)
            and (high is None or (value < high if open_high else value <= high))
        ):
            raise ValueError(text)
        return value

    noun = noun or ("a whole number" if kind is int else "a number")
    if high is None:
        return rule(convert, f"{noun} {'>' if open_low else '>='} {low}")
    span = f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
    return rule(convert, span if noun == "a number" else f"{noun} {span}")  # "in (0, 1)" says it is a number


def one_of(*names: str):
    def convert(text: str) -> str:
        if text not in names:
            raise ValueError(text)
        return text

    return rule(convert, ", ".join(names))


def text(allowed: str, check=None, names: bool = False, parsed: bool = False):
    """Non-blank text (names: at least one comma-separated name) as typed, or what `check` returns (parsed: even
    None, which then means something, e.g. every metric). `check` is a library function whose ValueError names the
    option itself (an unknown task, a file for a folder): its line is passed through."""

    def convert(text: str):
        if not any(part.strip() for part in (text.split(",") if names else [text])):
            raise ValueError(text)
        try:
            checked = check(text) if check else None
        except _Why:
            raise
        except (ValueError, NotImplementedError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return checked if parsed or checked is not None else text

    return rule(convert, allowed)


def _seed_list(text: str) -> list[int]:
    seeds = [int(x) for x in text.split(",") if x.strip()]  # negative or repeated: load_experiment says so
    if not seeds:
        raise ValueError(text)
    return seeds


def _size(text: str) -> str:
    from ablate.cost.memory import parse_size

    if parse_size(text) <= 0:
        raise ValueError(text)
    return text


def _set_pair(text: str) -> str:
    parse_set_args([text])  # ConfigError (a ValueError) when there is no section.field=
    return text


def _runs_root(text: str) -> str:
    """--out: a folder, made if missing (experiment.check_runs_root says why not in its own line)."""
    from ablate.setup.experiment import check_runs_root

    return str(check_runs_root(text))


def _samples_file(text: str) -> str:
    path = Path(text).expanduser()
    if path.is_dir():
        raise _Why("is a folder")
    if not path.parent.is_dir():
        raise _Why(f"{path.parent} is not a folder")
    return text


def _device(text: str) -> str:
    if text == "auto":  # the GPU where one is visible (ablate.setup.auto decides, as for training)
        from ablate.setup.auto import eval_device

        return str(eval_device(text))
    if text == "cpu":
        return text
    if not re.fullmatch(r"cuda(:[0-9]+)?", text):
        raise ValueError(text)
    import torch

    if not torch.cuda.is_available():
        raise _Why("no CUDA device is visible here")
    if int(text.partition(":")[2] or 0) >= torch.cuda.device_count():
        raise _Why(f"{torch.cuda.device_count()} CUDA devices are visible here")
    return text


def _budget(text: str) -> str:
    from ablate.report.sections.sequential.rule import parse_budget

    if parse_budget(text) is None:
        raise ValueError(text)
    return text


def _margin(text: str) -> tuple[str, float]:
    metric, sep, value = text.partition("=")
    margin = float(value) if sep and metric.strip() else math.nan
    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(text)
    return metric.strip(), margin


def _tasks(text: str) -> list[str]:
    from ablate.eval.suite import parse_tasks

    return parse_tasks(text)


def _metrics(text: str) -> tuple[str, ...] | None:
    from ablate.eval.suite import parse_metrics

    return parse_metrics(text)


def _format(text: str) -> None:
    from ablate.eval.suite import check_format

    check_format(text)


def _slurm(text: str) -> None:
    from ablate.launch.slurm import parse_slurm_options

    parse_slurm_options(text)


# the rules several options share
WHOLE_1 = number(int, 1)
SHARE = number(float, 0, 1, open_low=True, open_high=True)
CORRELATION = number(float, -1, 1)
NON_NEGATIVE = number(float, 0)
ONLY = text("variant names or globs, comma-separated, e.g. 'lr=0.01*'", names=True)
SEEDS = rule(_seed_list, "comma-separated whole numbers >= 0, e.g. 0,1,2")
SET = rule(_set_pair, "SECTION.FIELD=VALUE, e.g. train.max_steps=20")
DEVICE_MEMORY = rule(_size, "a size > 0 such as 24GiB, 80GB or 512MiB")
BUDGET = rule(
    _budget, "training tokens such as 2e8, 500M or 1.5B, or hours of compute (wall time x devices) such as 3h"
)
MARGIN = rule(_margin, "METRIC=VALUE with VALUE a number > 0, e.g. val_loss=0.01")
RUNS_ROOT = text("a folder (created if missing)", _runs_root)
PATH = text("a path")  # positionals: '' would silently mean the current folder

# the rules of one option each, with a check of their own
DEVICE = rule(_device, "auto, cpu, cuda, cuda:N")
TASKS = text("task or suite names, comma-separated", _tasks, names=True)  # the task names, suites expanded
METRICS = text("metric names, comma-separated, or all", _metrics, names=True, parsed=True)  # the names; None: all
EVAL_FORMAT = text("cf, mcf", _format)
SAMPLES_FILE = text("a file in an existing folder", _samples_file)
SLURM_OPTIONS = text("KEY=VALUE,... (see README)", _slurm)


def add_run_selection(parser, only_help: str, set_example: str) -> None:
    """The arguments that pick an experiment file's runs, as `ablate run` and `ablate plan` both take them."""
    parser.add_argument("file", type=PATH, help="experiment file (Python) defining `runs`")
    parser.add_argument("--only", action="append", type=ONLY, help=only_help)
    parser.add_argument("--seeds", type=SEEDS, help="comma-separated seeds, overriding the file's `seeds`")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=SET,
        metavar="SECTION.FIELD=VALUE",
        help=f"override a config field, e.g. --set {set_example} (repeatable)",
    )
