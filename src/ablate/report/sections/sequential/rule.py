"""An adaptive study's decision rule (`ablate run --until-decided`; `from ablate import DecisionRule` reads this
module alone), its budget, its metrics' names, and which of its fields may change after results.

A study trains its variants in rounds and, after each, asks of every contrast (a pair of variants on a decision
metric) whether it is decided. The seeds seen so far are a prefix of one sequence, the seeds in the order the study
trained them (its recorded rounds, never their numbers; the value a seed gives never depends on the study's
decisions). Two designs, a field of the rule (DecisionRule.design): "group_sequential" (the default;
stats/group_sequential.py), alpha spent over the looks the rule fixed before round 1 (up to max_seeds), and "anytime"
(stats/anytime.py), confidence sequences valid under any extension. A study recorded before designs existed continues
under "anytime", the design it was recorded with.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from ablate.report.stats import group_sequential
from ablate.rundir import STUDY

STUDY_FILE = STUDY  # runs/<experiment>/study.json: the rule, its history and the rounds (written by the driver)
DESIGNS = ("group_sequential", "anytime")
DEFAULT_SPENDING = "obrien_fleming"  # chosen by scripts/simulate_sequential.py --spendings (docs/reports.md)
DEFAULT_FUTILITY = 0.1
VAL_METRICS = {"val_loss": ("val_loss", "loss"), "val_bpb": ("val_loss", "bpb")}  # names -> (task key, metric)
_TOKENS = re.compile(r"^(\d+(?:\.\d*)?(?:[eE]\d+)?)([kKMBT]?)$")
_HOURS = re.compile(r"^(\d+(?:\.\d*)?)h$")
_SUFFIX = {"": 1, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def parse_budget(budget: str) -> tuple[str, float] | None:
    """A budget's limit: ("tokens", n) for "2e8" or "500M", ("device_seconds", s) for "3h"; None for "" (no
    budget). Raises ValueError for anything else."""
    text = budget.strip()
    if not text:
        return None
    if hours := _HOURS.match(text):
        value = float(hours.group(1))
        if value > 0:
            return "device_seconds", value * 3600
    elif tokens := _TOKENS.match(text):
        value = float(tokens.group(1)) * _SUFFIX[tokens.group(2)]
        if value > 0:
            return "tokens", value
    raise ValueError(budget)


def metric_key(name: str) -> tuple[str, str]:
    """A decision metric's name -> the report's (task key, metric): val_loss, val_bpb, or task/metric (a task
    without a format is its ":cf" one)."""
    if name in VAL_METRICS:
        return VAL_METRICS[name]
    task, _, metric = name.partition("/")
    return (task if ":" in task else f"{task}:cf"), metric


@dataclass(frozen=True)
class DecisionRule:
    """What an adaptive study decides on, fixed before its first round (recorded in study.json).

    metrics: the decision metrics as the report names them: val_loss, val_bpb (runs of different tokenizers), or a
    task metric "task/metric" (decided only where the item-noise floor is known: per-item files or logged standard
    errors). margins: metric -> equivalence margin (> 0) on the metric's scale; a metric without one never ends
    "equivalent". alpha: the chance of any wrong decision over the whole study. max_seeds: seeds per variant at
    most. budget: "" (none), training tokens ("2e8", "500M"), or hours of compute ("3h": wall time x devices).
    design: "group_sequential" (alpha spent over the looks up to max_seeds, fixed now: max_seeds may not be raised
    after results) or "anytime" (valid under any extension). spending: the group-sequential design's alpha
    spending (group_sequential.SPENDINGS). futility: a contrast whose estimated chance of being decided by max_seeds,
    if the difference is what it seems, falls below this is closed for futility (0: never; non-binding: the error
    guarantee holds whether or not it is followed)."""

    metrics: tuple[str, ...] = ("val_loss",)
    margins: dict[str, float] = field(default_factory=dict)
    alpha: float = 0.05
    max_seeds: int = 8
    budget: str = ""
    design: str = "group_sequential"
    spending: str = DEFAULT_SPENDING
    futility: float = DEFAULT_FUTILITY

    def to_dict(self) -> dict:
        return {**asdict(self), "metrics": list(self.metrics), "margins": dict(self.margins)}

    @classmethod
    def from_dict(cls, d: dict) -> DecisionRule:
        return cls(
            metrics=tuple(d.get("metrics", ("val_loss",))),
            margins={str(k): float(v) for k, v in (d.get("margins") or {}).items()},
            alpha=float(d.get("alpha", 0.05)),
            max_seeds=int(d.get("max_seeds", 8)),
            budget=str(d.get("budget", "")),
            design=str(d.get("design", "anytime")),  # recorded before designs existed: the design it ran under
            spending=str(d.get("spending", DEFAULT_SPENDING)),
            futility=float(d.get("futility", DEFAULT_FUTILITY)),
        )

    def check(self, where: str) -> None:
        """Raises ValueError naming `where`, the field and the values allowed."""
        metrics = self.metrics
        if isinstance(metrics, str) or not isinstance(metrics, (tuple, list)) or not metrics:
            raise ValueError(f"{where}: metrics must be a non-empty tuple of names (val_loss, val_bpb, task/metric)")
        for name in metrics:
            task, _, metric = name.partition("/") if isinstance(name, str) else ("", "", "")
            if not isinstance(name, str) or (name not in VAL_METRICS and not (task and metric)):
                raise ValueError(
                    f"{where}: metrics: {name!r} is not a decision metric; allowed: val_loss, val_bpb, or a task "
                    f"metric as task/metric (e.g. hellaswag/acc_per_char)"
                )
        if len(set(metrics)) < len(metrics):
            raise ValueError(f"{where}: metrics: a metric is named twice ({', '.join(metrics)})")
        if not isinstance(self.margins, dict):
            raise ValueError(f"{where}: margins must be a dict metric -> margin (e.g. {{'val_loss': 0.01}})")
        for name, margin in self.margins.items():
            if name not in metrics:
                raise ValueError(
                    f"{where}: margins: {name!r} is not one of the decision metrics ({', '.join(metrics)})"
                )
            if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 < margin < math.inf:
                raise ValueError(f"{where}: margins: {name}={margin!r}; allowed: a number > 0")
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
            raise ValueError(f"{where}: alpha={alpha!r}; allowed: a number between 0 and 1 (e.g. 0.05)")
        seeds = self.max_seeds
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 3:
            raise ValueError(f"{where}: max_seeds={seeds!r}; allowed: an integer >= 3 (nothing decides at 2 seeds)")
        if self.design not in DESIGNS:
            raise ValueError(f"{where}: design={self.design!r}; allowed: {', '.join(map(repr, DESIGNS))}")
        try:
            group_sequential.check_spending(self.spending if isinstance(self.spending, str) else repr(self.spending))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        futility = self.futility
        if isinstance(futility, bool) or not isinstance(futility, (int, float)) or not 0 <= futility < 1:
            raise ValueError(f"{where}: futility={futility!r}; allowed: a number in [0, 1) (0: never closes early)")
        try:
            if not isinstance(self.budget, str):
                raise ValueError(self.budget)
            parse_budget(self.budget)
        except ValueError:
            raise ValueError(
                f"{where}: budget={self.budget!r}; allowed: '' (none), training tokens ('2e8', '500M', '1.5B') or "
                f"hours of compute, wall time x devices ('3h')"
            ) from None

    def changes_from(self, other: DecisionRule, fields_only: bool = False) -> list[str]:
        """What differs from `other`, one "field: other's -> this one's" each (["alpha: 0.05 -> 0.1"]), or only the
        fields' names; [] when equal."""
        mine, theirs = self.to_dict(), other.to_dict()
        changed = [k for k in mine if mine[k] != theirs[k]]
        return changed if fields_only else [f"{k}: {_shown(theirs[k])} -> {_shown(mine[k])}" for k in changed]


def _shown(value) -> str:
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, dict):
        return ",".join(f"{k}={v:g}" for k, v in sorted(value.items())) or "none"
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


# The rule fields that only say where a study stops, which may change after results without touching a design's
# guarantee. anytime: Ville's inequality holds at any stopping time, so max_seeds may be raised or lowered; the
# group-sequential design fixed its looks' information fractions against max_seeds, so raising it is refused there
# (lowering it is stopping early: the budget's way). Futility is non-binding: the boundaries never assumed it.
STOPPING_ONLY = {
    "anytime": frozenset({"max_seeds", "budget", "futility"}),
    "group_sequential": frozenset({"budget", "futility"}),
}


def voids_guarantee(fields: set[str] | None, design: str = "anytime") -> bool:
    """Whether changing these rule fields after results were seen voids the study's error guarantee under `design`
    (None for a rule first set after results: it does)."""
    return fields is None or not fields <= STOPPING_ONLY.get(design, frozenset())
