"""Decide on anything a run logs: a metrics.jsonl key (a figure a user's callback logs, a loss term) as a decision
metric, `ablate report --metric KEY[:lower|higher]` (lower is better unless said), or as the primary metric,
`--primary KEY[:lower|higher]`.

runs.load_run keeps every numeric key of metrics.jsonl as the series (LOGGED_TASK, key). A key declared here becomes
a metric of the task LOGGED_TASK, compared as every series is (at the largest token count every run reached, each
run's value at or just before it: with the logging at validation's steps, the step validation loss is compared at;
over the training seeds) and tested with the other decision metrics, under the same error control. A key no run
logged is refused before any figure is computed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ablate.report.inputs.runs import LOGGED_TASK, ReportError, Run, TaskInfo
from ablate.text import natural_key

DIRECTIONS = {"lower": -1, "higher": 1}
DEFAULT_SIGN = -1  # a key declared without a direction: lower is better (a loss term)


@dataclass(frozen=True)
class Declared:
    """A logged key the report decides on: `sign` +1 when higher is better, -1 when lower; `flag` the option that
    declared it, as the user wrote it (for messages)."""

    key: str
    sign: int
    flag: str


def parse(text: str, flag: str = "--metric") -> Declared:
    """KEY, KEY:lower or KEY:higher (a key holding a colon keeps it: only these two suffixes are a direction)."""
    key, _, suffix = text.rpartition(":")
    if suffix in DIRECTIONS and key:
        return Declared(key, DIRECTIONS[suffix], f"{flag} {text}")
    return Declared(text, DEFAULT_SIGN, f"{flag} {text}")


def check_text(text: str) -> None:
    """--metric's check on the command line: a key before any direction."""
    if not parse(text).key.strip():
        raise ValueError(f"--metric {text}: a metrics.jsonl key, e.g. probe/acc or probe/acc:higher")


def logged_keys(runs: list[Run]) -> list[str]:
    """Every key some run logged a finite number under (but validation's, a task already), in natural order."""
    found = {metric for run in runs for task, metric in run.scores if task == LOGGED_TASK}
    return sorted(found, key=natural_key)


def declared(opts, runs: list[Run], tasks: dict[str, TaskInfo]) -> list[Declared]:
    """The keys --metric declares, then --primary's where it names a logged key and no task (one that names neither
    is refused by the primary's own check, once the series are known); ReportError, one line naming the flag, the
    key and the keys logged, for a --metric key no run logged."""
    have = logged_keys(runs)
    out = [parse(text) for text in getattr(opts, "metric", None) or []]
    for d in out:
        if d.key not in have:
            raise ReportError(
                f"{d.flag}: no run logged {d.key!r} in metrics.jsonl; keys logged: {', '.join(have) or 'none'} "
                f"(validation's val/loss and val/bpb are decided on already, as val_loss and val_bpb)"
            )
    primary = getattr(opts, "primary", None)
    if primary and primary.partition("/")[0] not in tasks and parse(primary).key in have:
        out.append(parse(primary, "--primary"))
    first = {}
    for d in out:  # a key declared twice: its first direction (--metric's before --primary's)
        first.setdefault(d.key, d)
    return list(first.values())


def is_named(want: str, key: str) -> bool:
    """Whether --primary's text names the logged key `key` (with or without a direction)."""
    return parse(want).key == key


def task_info(keys: list[Declared]) -> TaskInfo | None:
    """The task the declared keys are metrics of (None when none is declared): no items, no chance level, each key
    its own primary with its direction."""
    if not keys:
        return None
    return TaskInfo(LOGGED_TASK, "", [d.key for d in keys], None, LOGGED_TASK, declared={d.key: d.sign for d in keys})
