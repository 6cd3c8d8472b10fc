"""The report's options, declared once: each field's default, its help and what its flag accepts. `ablate report`
builds its flags from these fields (cli/report.py), report.json records them (report["options"]) and the text
reads their defaults from here.

Light on purpose (no numpy): the command line imports it to build its parser.
"""

from __future__ import annotations

from dataclasses import Field, asdict, dataclass, field, fields

from ablate.report.inputs.logged import check_text as check_metric
from ablate.report.inputs.match import MAX_TOKEN_GAP


@dataclass(frozen=True)
class Bounds:
    """What a numeric flag accepts: `kind` (int or float) within [low, high], an end open where said."""

    kind: type
    low: float
    high: float | None = None
    open_low: bool = False
    open_high: bool = False


SHARE = Bounds(float, 0, 1, open_low=True, open_high=True)
CORRELATION = Bounds(float, -1, 1)
NON_NEGATIVE = Bounds(float, 0)


def option(
    default,
    help: str,
    accepts: Bounds | str,
    metavar: str | None = None,
    shown: str | None = None,
    check=None,
    repeat: bool = False,
):
    """A field that is also a flag of `ablate report`: --NAME (underscores as dashes). accepts: the numbers it takes,
    or in words the text it takes (a list default: comma-separated names, or with repeat one value per use of the
    flag); shown: the default as the help says it (default: the value; None: "off"); check: text -> the value,
    raising ValueError that says what is allowed."""
    metadata = {"help": help, "accepts": accepts, "metavar": metavar, "shown": shown, "check": check, "repeat": repeat}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


FLOOR_CHOICES = ("auto", "shared")


def floor_value(text: str | float) -> str | float:
    """--multiplier-floor: "auto", "shared" or a loss in nats > 0 (E pinned there at every rung)."""
    if text in FLOOR_CHOICES:
        return text
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = None
    if value is None or not (value > 0 and value < float("inf")):
        raise ValueError(f"--multiplier-floor {text}: allowed: auto, shared, or a loss in nats > 0")
    return value


@dataclass
class Options:
    alpha: float = option(0.05, "the study's error rate: A/A any-claim rate over the primary and task families", SHARE)
    primary_share: float = option(
        0.8,
        "share of alpha the primary metric's family is tested at; the task metrics get the rest",
        Bounds(float, 0, 1, open_low=True),
    )
    primary: str | None = option(
        None,
        "the primary metric, tested as its own family: a task, task/metric, or a metrics.jsonl key",
        "a task, task/metric or metrics.jsonl key, e.g. arc_easy:cf, arc_easy:cf/acc_raw or probe/acc:higher",
        shown="default: validation loss, or its bpb across tokenizers",
    )
    metric: list[str] = option(
        [],
        "decide on a metrics.jsonl key too (a callback's figure, a loss term), tested with the other decision metrics; "
        "lower is better unless :higher (repeatable)",
        "a metrics.jsonl key, e.g. probe/acc or probe/acc:higher",
        metavar="KEY[:lower|higher]",
        shown="none",
        check=check_metric,
        repeat=True,
    )
    max_token_gap: float = option(
        MAX_TOKEN_GAP, "pairs whose compared points are further apart in tokens (relative) are not tested", NON_NEGATIVE
    )
    min_seeds: int = option(3, "seeds per variant needed to test a difference", Bounds(int, 2))
    power: float = option(0.8, "the power 'seeds needed' is estimated for", SHARE)
    min_shared_items: float = option(
        0.5,
        "runs scored different items: compare over shared ids when they are >= this share",
        Bounds(float, 0, 1, open_low=True),
    )
    min_monotonicity: float = option(
        0.5, "early-signal threshold: mean Spearman rho of score vs step, FineTasks'", CORRELATION
    )
    min_tau: float = option(
        0.6, "threshold on the mean Kendall tau vs the final ranking over the second half of training", CORRELATION
    )
    min_z: float = option(2.0, "standard errors past chance to count as above it", NON_NEGATIVE)
    min_snr: float | None = option(
        None, "optional threshold on the signal-to-noise ratio, FineTasks used 20", NON_NEGATIVE
    )
    last_k: int = option(3, "last checkpoints whose spread is a run's noise", Bounds(int, 2))
    average_last: int = option(
        1,
        "a run's score: the mean of its last K evaluations, less checkpoint noise (1: the last)",
        Bounds(int, 1),
        metavar="K",
    )
    subject_snr_floor: float | None = option(
        None,
        "leave a grouped task's subjects (MMLU) of SNR below X out of its average",
        Bounds(float, 0, open_low=True),
        metavar="X",
    )
    early_fraction: float = option(0.25, "share of training of the 'early' checkpoint for decision accuracy", SHARE)
    bootstrap: int = option(
        2000, "replicates of the bootstrap intervals (decision accuracy, sweeps)", Bounds(int, 100, 1_000_000)
    )
    seed: int = 0  # bootstrap RNG seed, no flag: the same runs give the same report
    scale: list[str] = option(
        [],
        "config field(s) forming a scale axis, e.g. model.d_model (comma-separated)",
        "config fields, comma-separated, e.g. model.d_model",
        shown="none: one scale",
    )
    baseline: str | None = option(
        None,
        "the method compute multipliers are measured against: its name without the scale suffix",
        "a method's name, e.g. baseline",
        shown="none: no compute multipliers",
    )
    multiplier_floor: str | float = option(
        "auto",
        "the baseline curve's E (irreducible loss): shared (one E across rungs), a loss to pin it at, or auto "
        "(fitted at a rung with >= 4 compute points, else shared)",
        "auto, shared, or a loss in nats > 0",
        check=floor_value,
    )
    multiplier_target: float | None = option(
        None,
        "project each compute multiplier along its trend to this many FLOPs (labelled an extrapolation)",
        Bounds(float, 0, open_low=True),
        metavar="FLOPS",
    )


def recorded(opts: Options) -> dict:
    """The options as report.json records them: every field, but --metric only where given (a report without it
    reads as before it existed)."""
    return {k: v for k, v in asdict(opts).items() if k != "metric" or v}


def flags() -> list[Field]:
    """The fields of Options that are flags of `ablate report`, in declaration order."""
    return [f for f in fields(Options) if "help" in f.metadata]
