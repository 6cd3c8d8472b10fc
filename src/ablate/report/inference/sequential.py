"""Adaptive studies (`ablate run --until-decided`): the decision rule, the two designs' intervals, decisions, and a
contrast in one line (contrast_line: the study driver's and `ablate status`'s, which read no other wording).

A study trains its variants in rounds and, after each, asks of every contrast (a pair of variants on a decision
metric) whether it is decided. The seeds seen so far are a prefix of one sequence, the seeds in the order the study
trained them (its recorded rounds, never their numbers; the value a seed gives never depends on the study's
decisions). Two designs, a field of the rule (DecisionRule.design): "group_sequential" (the default;
stats/group_sequential.py), alpha spent over the looks the rule fixed before round 1 (up to max_seeds), and "anytime"
(stats/anytime.py), confidence sequences valid under any extension. A study recorded before designs existed continues
under "anytime", the design it was recorded with.

Across the K contrasts of a study (pairs x decision metrics): under the anytime design Bonferroni, each contrast at
alpha / K: it holds under any dependence between contrasts (they share variants and seeds): with probability >= 1 -
alpha every interval of every contrast covers its true difference at every round, and a wrong decision needs a miss.
Under the group-sequential design Holm's recycling (decide_study): each contrast starts at alpha / K, and once r are
decided on a side the others are judged at alpha / (K - r), every look at the boundaries of that level (Maurer and
Bretz 2013); a decided contrast's alpha passes to those still open.

Noise model (stats.seed_test's, the fixed report's): the mean difference's variance is max(s^2, fresh) / n +
item_var, fresh the items' fresh answer noise in one run-level difference (a floor on s^2: accuracies move in steps,
so a few seeds sometimes agree exactly by chance) and item_var the persistent item-set part, the same on every seed
and so not divided by the seeds (a difference every seed repeats is evidence only as far as its items are). The t
uses s^2_eff = max(s^2, fresh) + n item_var on n - 1 degrees of freedom; the item term is a fixed-sample estimate,
the same at every look. Per-seed differences with no spread and no known item noise give no interval (open).

Decision of a contrast: "equivalent" when its interval lies inside (-margin, +margin) (checked first), else the
better side when it excludes 0, else, under the group-sequential design, "futile" (closed for futility) when its
estimated chance of a decision by max_seeds is below rule.futility (group_sequential.decision_chance), else "open".
Only open contrasts get seeds. Study records written before 2026-11-27 name "futile" "undecidable" (OLD_FUTILE); the
report recomputes every decision, and the driver's own log reads both.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

from ablate.report.stats import group_sequential
from ablate.report.stats.anytime import running_interval
from ablate.rundir import STUDY

STUDY_FILE = STUDY  # runs/<experiment>/study.json: the rule, its history and the rounds (written by the driver)
DESIGNS = ("group_sequential", "anytime")
DEFAULT_SPENDING = "obrien_fleming"  # chosen by scripts/simulate_sequential.py --spendings (docs/reports.md)
DEFAULT_FUTILITY = 0.1
FUTILE = "futile"  # a decision: closed for futility (its estimated chance of a decision fell below rule.futility)
OLD_FUTILE = "undecidable"  # the same decision as study.json files written before 2026-11-27 name it
CLOSED = (FUTILE, OLD_FUTILE)  # a recorded decision that reads "closed for futility"
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


@dataclass
class Contrast:
    """One pair of variants on one decision metric. interval: the anytime-valid interval for mean(a - b) on the
    metric's scale (None: fewer than 2 pairs or no spread at all; infinite ends: not bounded yet)."""

    a: str
    b: str
    metric: str
    decision: str  # "a" (a better), "b" (b better), "equivalent", "futile" (closed for futility), "open"
    seeds: int  # paired seeds used
    interval: tuple[float, float] | None
    estimate: float | None  # mean(a - b)
    margin: float | None
    decided_at: int | None = None  # the paired seeds at which it was first decided
    note: str = ""  # why it cannot decide (no floor for a task metric, a metric missing), unpaired runs
    boundary: float | None = None  # group-sequential: the critical |t| its last look was held to (inf: none yet)
    looks: list[int] = field(default_factory=list)  # group-sequential: the paired seeds at each look
    level: float | None = None  # the alpha it was judged at (Holm's recycling raises alpha / K; None: not judged)
    chance: float | None = None  # closed for futility: its estimated chance of a decision by max_seeds
    fixed_power: float | None = None  # closed for futility: the fixed max_seeds-seed t-test's power at `level`

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.interval is not None:  # JSON has no infinity: an unbounded end is null
            d["interval"] = [x if math.isfinite(x) else None for x in self.interval]
        if self.boundary is not None and not math.isfinite(self.boundary):
            d["boundary"] = None
        return d


def decide(interval, margin: float | None, lower_is_better: bool) -> str:
    """ "equivalent" when the interval for mean(a - b) lies inside (-margin, +margin) (first: it takes precedence);
    else "a" or "b", the better side, when it excludes 0; else "open" (also without an interval)."""
    if interval is None:
        return "open"
    lo, hi = interval
    if margin is not None and -margin < lo and hi < margin:
        return "equivalent"
    if lo > 0:
        return "b" if lower_is_better else "a"
    if hi < 0:
        return "a" if lower_is_better else "b"
    return "open"


def decide_contrast(
    prefixes: list[tuple],
    alpha: float,
    margin: float | None,
    lower_is_better: bool,
    rule: DecisionRule | None = None,
    looks: list[int] | None = None,
) -> tuple:
    """(decision after the last prefix, its running interval, the paired seeds at which it was first made (a
    decision, once made, is kept: the interval only narrows), the critical |t| of the last look, and for a contrast
    closed for futility (its estimated chance of a decision by max_seeds, the difference seen in seed-level sds for
    fixed_power), else None). prefixes: [(the per-seed differences of the first n seeds, floor_var, item_var), ...]
    for n = 2, 3, ...; alpha: this contrast's own level. rule: its design (None: anytime); looks: the
    group-sequential design's looks, the paired seeds after each round (prefixes of other lengths are not looks)."""
    if rule is None or rule.design == "anytime":
        interval, decided_at = None, None
        for k in range(len(prefixes)):
            interval = running_interval(prefixes[: k + 1], alpha)
            if decided_at is None and decide(interval, margin, lower_is_better) != "open":
                decided_at = len(prefixes[k][0])
        return decide(interval, margin, lower_is_better), interval, decided_at, None, None
    return _decide_looks(prefixes, looks or [], alpha, margin, lower_is_better, rule)


def _decide_looks(prefixes, looks, alpha, margin, lower_is_better, rule: DecisionRule):
    """The group-sequential decision: at each look, the repeated interval at that look's boundary, intersected with
    the earlier ones; open and futile (group_sequential.decision_chance below rule.futility): closed for futility,
    until a later look decides it. The boundaries are those of the looks taken, then one a seed up to max_seeds (a
    look's boundary depends only on the looks up to it). Returns decide_contrast's four first values and, for a contrast
    closed for futility, (its estimated chance of a decision, the difference seen in seed-level sds as the fixed
    max_seeds-seed t-test sees it: fixed_power's effect) at the look that closed it (else None)."""
    gs, most = group_sequential, rule.max_seeds
    by_n = {len(p[0]): (*p, 0.0, 0.0)[:3] for p in prefixes}
    taken = sorted({n for n in looks if n in by_n and n <= most})
    if not taken:
        return "open", None, None, None, None
    noise = [_seed_noise(*by_n[n])[1:] for n in taken]  # each look's (per-seed, item) variance: its boundary
    bounds = gs.boundaries([*taken, *range(taken[-1] + 1, most + 1)], most, alpha, rule.spending, noise=noise)
    interval, decided_at, futile = None, None, None
    for k, n in enumerate(taken):
        now = gs.repeated_interval(by_n[n][0], bounds[k], *by_n[n][1:])
        if now is not None:
            both = now if interval is None else (max(interval[0], now[0]), min(interval[1], now[1]))
            interval = both if both[0] <= both[1] else now
        if decide(interval, margin, lower_is_better) != "open":
            decided_at = decided_at or n
        elif rule.futility and n < most and futile is None:
            mean, seed_var, item_var = _seed_noise(*by_n[n])
            if seed_var > 0:
                chance = gs.decision_chance(mean, seed_var, item_var, n, most, bounds[-1], margin, by_n[n][1])
                effect = abs(mean) / math.sqrt(seed_var + most * item_var)  # the fixed test's, in seed-level sds
                futile = (chance, effect) if chance < rule.futility else None
    decision = decide(interval, margin, lower_is_better)
    closed = decision == "open" and futile is not None
    return (FUTILE if closed else decision), interval, decided_at, bounds[len(taken) - 1], futile if closed else None


def fixed_power(effect: float, max_seeds: int, alpha: float) -> float:
    """The fixed max_seeds-seed t-test's power at level alpha for a difference of `effect` seed-level sds (|mean| /
    sqrt(s^2 + max_seeds tau^2), its t's noncentrality over sqrt(max_seeds)): what a design without looks had."""
    from ablate.report.stats.stats import t_power

    return t_power(max_seeds, effect, alpha, paired=True)


def decide_study(contrasts: int, alpha: float, decide_at, recycle: bool = True) -> tuple[list, list[float]]:
    """Holm's recycling (graphical, Maurer and Bretz 2013) over a study's K contrasts: each is first judged at
    alpha / K; once r of them are decided on a side (their "no difference" rejected), the others are judged again at
    alpha / (K - r), all their looks at the boundaries of that level (with the same spending the group-sequential
    boundaries at the new level apply to every look taken), until nothing changes. Decisions at a level stay
    decided at the larger ones (their intervals only narrow), so this is deterministic from the recorded data.
    "equivalent" does not recycle: a contrast of no difference may be rightly decided equivalent, and its
    no-difference hypothesis is then still true; Holm passes on only the alpha of hypotheses rejected.
    decide_at(i, level) -> contrast i's decision tuple (decision first) at that level. recycle=False: Bonferroni
    (every contrast at alpha / K). Returns the decisions and the level each was judged at."""
    level = alpha / max(1, contrasts)
    results, levels, settled = [None] * contrasts, [level] * contrasts, set()
    while True:
        for i in range(contrasts):
            if i not in settled:
                results[i], levels[i] = decide_at(i, level), level
                if results[i][0] not in ("open", FUTILE):
                    settled.add(i)
        sides = sum(results[i][0] in ("a", "b") for i in settled)
        raised = alpha / max(1, contrasts - sides)
        if not recycle or raised <= level * (1 + 1e-12):
            return results, levels
        level = raised


def _seed_noise(diffs, floor_var, item_var) -> tuple[float, float, float]:
    """(mean, per-seed variance floored by the fresh noise, item-set variance) of per-seed differences."""
    n = len(diffs)
    mean = sum(diffs) / n
    return mean, max(sum((x - mean) ** 2 for x in diffs) / (n - 1), floor_var or 0.0), item_var or 0.0


def open_variants(contrasts) -> set[str]:
    """The variants in at least one open contrast: those a next round gives a seed."""
    return {v for c in contrasts if c.decision == "open" for v in (c.a, c.b)}


# ---------------------------------------------------------------------------------------------------------------
# contrasts from the study's runs, read as the fixed report reads them


def study_contrasts(
    runs,
    rule: DecisionRule,
    variants: list[str] | None = None,
    trained: dict[str, dict[int, tuple[int, int]]] | None = None,
    max_token_gap: float | None = None,
) -> list[Contrast]:
    """Every pair of `variants` (default: every variant of the runs) x every decision metric of the rule, decided
    from the study's runs (as inputs/runs.load_runs reads them from its run folders: study_section.folder_contrasts)
    through the fixed report's own reading: match.match's final value of each run, stats.seed_test's seed pairing and
    noise model (at every prefix of the paired seeds). Only finished runs are paired; others are counted in each
    contrast's note. Over the K contrasts: Holm's recycling under the group-sequential design, Bonferroni (rule.alpha
    / K each) under the anytime one (decide_study). trained: when the study trained each seed (trained_order of
    study.json); each pair's prefixes follow it, never the seed numbers (a file's seeds 5, 6, 7 then seed 0: 0 is
    the fourth). Like with like as in the fixed report: a pair whose compared points fail match.token_gap
    (max_token_gap, default --max-token-gap's) is not decided; a variant with a failed or diverged seed is never
    decided better, nor equivalent (its survivors are a selected sample)."""
    from ablate.report.inference import families
    from ablate.report.inputs import match, tokenizers
    from ablate.report.inputs.runs import direction, task_infos
    from ablate.text import natural_key

    names = list(variants) if variants is not None else sorted({r.variant for r in runs}, key=natural_key)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    finished = {v: [r for r in runs if r.variant == v and r.status == "finished"] for v in names}
    unpaired = {v: sorted(r.seed for r in runs if r.variant == v and r.status != "finished") for v in names}
    failed = families.failure_texts(families.failed_seeds({v: [r for r in runs if r.variant == v] for v in names}))
    tasks = task_infos([r for rs in finished.values() for r in rs])
    compare_bpb = _tokenizers_differ(runs, tasks)
    gap = match.MAX_TOKEN_GAP if max_token_gap is None else max_token_gap
    out = []
    for name in rule.metrics:
        task_key, metric = metric_key(name)
        shown, margin, why = name, rule.margins.get(name), ""
        if name == "val_loss" and compare_bpb:  # loss per token does not compare across tokenizers
            metric, shown, margin = "bpb", "val_bpb", None
            why = "tokenizers differ: compared in bits per byte, where a val_loss margin does not apply"
        refused = tokenizers.different_text(runs) if shown == "val_bpb" and compare_bpb else None
        if task_key == "val_loss":  # two definitions of validation (before and after whole documents) never pair
            refused = tokenizers.mixed_validation(runs) or refused
        scores = None if refused else _scores(finished, tasks.get(task_key), metric)
        for a, b in pairs:
            order = _pair_order(a, b, trained or {})
            c, inputs = _contrast(a, b, shown, scores, rule, margin, direction(metric) < 0, task_key, order, gap)
            c.note = "; ".join(filter(None, [why, f"not decided: {refused}" if refused else c.note]))
            never = [f"{v}: {failed[v]} (never decided better or equivalent)" for v in (a, b) if v in failed]
            c.note = "; ".join(filter(None, [c.note, *never]))
            skipped = [f"{v}: seed{'s' * (len(unpaired[v]) > 1)} {_seeds(unpaired[v])}" for v in (a, b) if unpaired[v]]
            if skipped:
                c.note = "; ".join(filter(None, [c.note, "unfinished or failed, not paired: " + ", ".join(skipped)]))
            out.append((c, inputs))

    def decide_at(i: int, level: float) -> tuple:
        c, inputs = out[i]
        if inputs is None:
            return "open", None, None, None, None
        result = decide_contrast(inputs[0], level, *inputs[1:])
        return _never_better_on_survivors(c, result, failed)

    results, levels = decide_study(len(out), rule.alpha, decide_at, recycle=rule.design != "anytime")
    for (c, inputs), result, level in zip(out, results, levels):
        c.decision, c.interval, c.decided_at, c.boundary, futile = result
        c.level = level if inputs is not None else None
        if futile:
            c.chance, c.fixed_power = futile[0], fixed_power(futile[1], rule.max_seeds, level)
    return [c for c, _ in out]


def _never_better_on_survivors(c: Contrast, result: tuple, failed: dict[str, str]) -> tuple:
    """The fixed report's rule (families.winner's `never`) in an adaptive study: a variant with a failed or diverged
    seed is compared on its finished seeds, which survived a selection, so the contrast may find it worse but never
    better or equivalent (such a decision becomes open: `result`, decide_contrast's, with its decision and
    decided_at replaced)."""
    decision = result[0]
    for v in (c.a, c.b):
        if v in failed and (decision == "equivalent" or (decision in ("a", "b") and getattr(c, decision) == v)):
            return ("open", result[1], None, *result[3:])
    return result


def trained_order(study: dict) -> dict[str, dict[int, tuple[int, int]]]:
    """variant -> {seed: when the study trained it (round index, place in the round's list)} from study.json."""
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for i, entry in enumerate(study.get("rounds") or []):
        for variant, seeds in (entry.get("seeds") or {}).items():
            for j, seed in enumerate(seeds):
                out.setdefault(variant, {}).setdefault(seed, (i, j))
    return out


def _pair_order(a: str, b: str, trained: dict[str, dict[int, tuple[int, int]]]):
    """The sort key of a pair's shared seeds: when both had trained the seed (seeds the study did not record come
    last, by number)."""
    unrecorded = (math.inf, math.inf)

    def key(seed: int):
        return (max(trained.get(v, {}).get(seed, unrecorded) for v in (a, b)), seed)

    return key


def _seeds(seeds: list[int]) -> str:
    return ", ".join(str(s) for s in seeds)


def _tokenizers_differ(runs, tasks) -> bool:
    from ablate.report.inputs import tokenizers

    return len(set(tokenizers.identities(runs).values())) > 1 and "val_loss" in tasks


def _scores(finished: dict, task, metric: str) -> dict | None:
    """variant -> (seed -> score, (seeds, items) matrix in seed order or None, seed -> logged stderr, seed -> tokens
    at the compared point), from one match over every finished run (equal tokens, identical items), as the fixed
    report scores a series."""
    import numpy as np

    from ablate.report.inputs import match

    if task is None:
        return None
    key = (task.key, metric)
    runs = [r for rs in finished.values() for r in rs if r.scores.get(key)]
    if not runs:
        return None
    m = match.match(runs, task, metric, 0.5)
    if m.left_out:
        return None
    out = {}
    for variant, rs in finished.items():
        rs = sorted((r for r in rs if r.label in m.points), key=lambda r: r.seed)
        items = np.array([[m.values[r.label][i] for i in m.ids] for r in rs]) if m.ids and rs else None
        stderrs, tokens = ({r.seed: getattr(m.points[r.label], f) for r in rs} for f in ("stderr", "tokens"))
        out[variant] = ({r.seed: m.score(r.label) for r in rs}, items, stderrs, tokens)
    return out


def pair_looks(shared: list[int], order) -> list[int]:
    """The paired seeds after each round that added one of `shared` (in the order `order` gives: rounds first,
    seeds the study did not record last, as one look)."""
    rounds = [order(s)[0][0] for s in shared]  # the round a seed became paired in
    return [i + 1 for i in range(len(shared)) if i + 1 == len(shared) or rounds[i + 1] != rounds[i]]


def _contrast(a, b, metric, scores, rule, margin, lower_is_better, task_key, order, max_token_gap) -> tuple:
    """(the contrast, undecided, and its decision's inputs: decide_contrast's arguments but alpha as (prefixes,
    margin, lower_is_better, rule, looks); None where it cannot decide, the contrast's note saying why)."""
    from ablate.report.stats import stats
    from ablate.report.inputs import match

    contrast = Contrast(a, b, metric, "open", 0, None, None, margin)
    if scores is None or a not in scores or b not in scores:
        contrast.note = f"no {metric} in the finished runs of both variants"
        return contrast, None
    (sa, ia, ea, ta), (sb, ib, eb, tb) = scores[a], scores[b]
    shared = sorted(set(sa) & set(sb), key=order)  # the order the study trained them: each prefix a fixed one
    prefixes = []
    for n in range(2, len(shared) + 1):
        keep = shared[:n]
        rows_a = None if ia is None else ia[[sorted(sa).index(s) for s in keep]]
        rows_b = None if ib is None else ib[[sorted(sb).index(s) for s in keep]]
        t = stats.seed_test({s: sa[s] for s in keep}, {s: sb[s] for s in keep}, rows_a, rows_b, ea, eb)
        noise = [(t[key] or 0.0) ** 2 for key in ("noise_floor_sd", "item_sd")]
        prefixes.append(([sa[s] - sb[s] for s in keep], *noise))
    contrast.seeds = len(shared)
    if shared:
        contrast.estimate = sum(sa[s] - sb[s] for s in shared) / len(shared)
    _, refused = match.token_gap(list(ta.values()) + list(tb.values()), max_token_gap)
    if refused:  # the fixed report's rule, through the same function: not compared, not decided
        contrast.note = f"not decided: {refused}"
        return contrast, None
    if task_key != "val_loss" and prefixes and not any(prefixes[-1][1:]):
        contrast.note = "no item-noise floor known (no per-item files or standard errors): a task metric cannot decide"
        return contrast, None
    contrast.looks = pair_looks(shared, order) if rule.design != "anytime" else []
    return contrast, (prefixes, margin, lower_is_better, rule, contrast.looks)


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


# ---------------------------------------------------------------------------------------------------------------
# a contrast in words: the study driver's lines, `ablate status`'s and the report's futility


def futility_text(c: dict, futility: float | None = None, max_seeds: int | None = None) -> str:
    """'closed for futility (estimated chance of a decision < 0.1)', with the chance itself and the fixed design's
    power at the difference seen where the contrast records them (report.json's `chance` and `fixed_power`)."""
    below = f" < {futility:g}" if futility else " below the rule's futility threshold"
    text = f"closed for futility (estimated chance of a decision{below})"
    extra = []
    if c.get("chance") is not None:
        extra.append(f"estimated chance {c['chance']:.2f}")
    if c.get("fixed_power") is not None:
        seeds = f"{max_seeds}-seed " if max_seeds else ""
        extra.append(f"a fixed {seeds}design's power at the difference seen {c['fixed_power']:.2f}")
    return text + (f": {'; '.join(extra)}" if extra else "")


def _margin(value) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, "g")


def _end(value, unbounded: str) -> str:
    return unbounded if value is None else f"{value:+.4g}"


def contrast_line(c: dict, futility: float | None = None) -> str:
    """One contrast of a study (a Contrast's to_dict(), as study.json records it): open or decided, seeds, the
    interval of a - b. futility: the rule's threshold, named when a contrast is closed for futility."""
    verdict = {
        "a": f"decided: {c['a']} better",
        "b": f"decided: {c['b']} better",
        "equivalent": f"decided: equivalent within +-{_margin(c.get('margin'))}",
    }.get(c["decision"], futility_text(c, futility) if c["decision"] in CLOSED else "open")
    interval = c.get("interval")  # an end not bounded yet is null
    shown = f"[{_end(interval[0], '-inf')}, {_end(interval[1], '+inf')}]" if interval else "none yet"
    note = f"; {c['note']}" if c.get("note") else ""
    held = f", boundary |t| {c['boundary']:.3g}" if c.get("boundary") is not None else ""
    return f"{c['metric']}  {c['a']} vs {c['b']}: {verdict}  ({c['seeds']} seeds, interval of a-b {shown}{held}{note})"
