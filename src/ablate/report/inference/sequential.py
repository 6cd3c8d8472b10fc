"""Adaptive studies (`ablate run --until-decided`): the decision rule, the two designs' intervals, decisions.

A study trains its variants in rounds and, after each, asks of every contrast (a pair of variants on a decision
metric) whether it is decided. The seeds seen so far are a prefix of one sequence, the seeds in the order the study
trained them (its recorded rounds, never their numbers; the value a seed gives never depends on the study's
decisions). Two designs, a field of the rule (DecisionRule.design): "group_sequential" (the default;
group_sequential.py), alpha spent over the looks the rule fixed before round 1 (up to max_seeds), and "anytime"
(anytime.py), confidence sequences valid under any extension. A study recorded before designs existed continues
under "anytime", the design it was recorded with.

Across the K contrasts of a study (pairs x decision metrics): Bonferroni, each contrast at alpha / K, under either
design. It holds under any dependence between contrasts (they share variants and seeds): with probability >= 1 -
alpha every interval of every contrast covers its true difference at every round. A wrong decision needs a miss, so
alpha bounds the chance of any wrong winner or wrong equivalence.

Noise model (stats.seed_test's, the fixed report's): the mean difference's variance is max(s^2, fresh) / n +
item_var, fresh the items' fresh answer noise in one run-level difference (a floor on s^2: accuracies move in steps,
so a few seeds sometimes agree exactly by chance) and item_var the persistent item-set part, the same on every seed
and so not divided by the seeds (a difference every seed repeats is evidence only as far as its items are). The t
uses s^2_eff = max(s^2, fresh) + n item_var on n - 1 degrees of freedom; the item term is a fixed-sample estimate,
the same at every look. Per-seed differences with no spread and no known item noise give no interval (open).

Decision of a contrast: "equivalent" when its interval lies inside (-margin, +margin) (checked first), else the
better side when it excludes 0, else, under the group-sequential design, "undecidable" when its futility rule
closes it (group_sequential.decision_chance below rule.futility), else "open". Only open contrasts get seeds.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ablate.report.inference import group_sequential
from ablate.report.inference.anytime import MIXTURE_G, running_interval
from ablate.rundir import STUDY

STUDY_FILE = STUDY  # runs/<experiment>/study.json: the rule, its history and the rounds (written by the driver)
DESIGNS = ("group_sequential", "anytime")
DEFAULT_SPENDING = "hsd:-2"  # chosen by scripts/simulate_sequential.py --designs (docs/reports.md)
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
    spending (group_sequential.SPENDINGS). futility: a contrast whose chance of being decided by max_seeds, if the
    difference is what it seems, falls below this closes as undecidable (0: never; non-binding: the error
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
    decision: str  # "a" (a better), "b" (b better), "equivalent", "undecidable" (futile: closed), "open"
    seeds: int  # paired seeds used
    interval: tuple[float, float] | None
    estimate: float | None  # mean(a - b)
    margin: float | None
    decided_at: int | None = None  # the paired seeds at which it was first decided
    note: str = ""  # why it cannot decide (no floor for a task metric, a metric missing), unpaired runs
    boundary: float | None = None  # group-sequential: the critical |t| its last look was held to (inf: none yet)
    looks: list[int] = field(default_factory=list)  # group-sequential: the paired seeds at each look

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


def decide_prefixes(
    prefixes: list[tuple],
    alpha: float,
    margin: float | None,
    lower_is_better: bool,
    rule: DecisionRule | None = None,
    looks: list[int] | None = None,
) -> tuple[str, tuple[float, float] | None, int | None, float | None]:
    """The decision after the last prefix, its running interval, the paired seeds at which it was first made (a
    decision, once made, is kept: the interval only narrows) and the critical |t| of the last look. prefixes: [(the
    per-seed differences of the first n seeds, floor_var, item_var), ...] for n = 2, 3, ...; alpha: this contrast's
    own level. rule: its design (None: anytime); looks: the group-sequential design's looks, the paired seeds after
    each round (prefixes of other lengths are not looks)."""
    if rule is None or rule.design == "anytime":
        interval, decided_at = None, None
        for k in range(len(prefixes)):
            interval = running_interval(prefixes[: k + 1], alpha)
            if decided_at is None and decide(interval, margin, lower_is_better) != "open":
                decided_at = len(prefixes[k][0])
        return decide(interval, margin, lower_is_better), interval, decided_at, None
    return _decide_looks(prefixes, looks or [], alpha, margin, lower_is_better, rule)


def _decide_looks(prefixes, looks, alpha, margin, lower_is_better, rule: DecisionRule):
    """The group-sequential decision: at each look, the repeated interval at that look's boundary, intersected with
    the earlier ones; open and futile (group_sequential.decision_chance below rule.futility): undecidable, until a
    later look decides it. The boundaries are those of the looks taken, then one a seed up to max_seeds (a look's
    boundary depends only on the looks up to it)."""
    gs, most = group_sequential, rule.max_seeds
    by_n = {len(p[0]): (*p, 0.0, 0.0)[:3] for p in prefixes}
    taken = sorted({n for n in looks if n in by_n and n <= most})
    if not taken:
        return "open", None, None, None
    noise = [_seed_noise(*by_n[n]) for n in taken]  # (mean, per-seed variance, item variance) at each look
    bounds = gs.boundaries([*taken, *range(taken[-1] + 1, most + 1)], most, alpha, rule.spending)
    interval, decided_at, futile = None, None, False
    for k, n in enumerate(taken):
        now = gs.repeated_interval(by_n[n][0], bounds[k], *by_n[n][1:])
        if now is not None:
            both = now if interval is None else (max(interval[0], now[0]), min(interval[1], now[1]))
            interval = both if both[0] <= both[1] else now
        mean, seed_var, item_var = noise[k]
        if decide(interval, margin, lower_is_better) != "open":
            decided_at = decided_at or n
        elif rule.futility and n < most and seed_var > 0 and not futile:
            futile = gs.decision_chance(mean, seed_var, item_var, n, most, bounds[-1], margin) < rule.futility
    decision = decide(interval, margin, lower_is_better)
    return ("undecidable" if decision == "open" and futile else decision), interval, decided_at, bounds[len(taken) - 1]


def _seed_noise(diffs, floor_var, item_var) -> tuple[float, float, float]:
    """(mean, per-seed variance floored by the fresh noise, item-set variance) of per-seed differences."""
    n = len(diffs)
    mean = sum(diffs) / n
    return mean, max(sum((x - mean) ** 2 for x in diffs) / (n - 1), floor_var or 0.0), item_var or 0.0


def open_variants(contrasts) -> set[str]:
    """The variants in at least one open contrast: those a next round gives a seed."""
    return {v for c in contrasts if c.decision == "open" for v in (c.a, c.b)}


# ---------------------------------------------------------------------------------------------------------------
# contrasts from run folders, read as the fixed report reads them


def study_contrasts(
    runs_dir,
    rule: DecisionRule,
    variants: list[str] | None = None,
    runs=None,
    trained: dict[str, dict[int, tuple[int, int]]] | None = None,
    max_token_gap: float | None = None,
) -> list[Contrast]:
    """Every pair of `variants` (default: every variant folder) x every decision metric of the rule, decided from
    the run folders under runs_dir through the fixed report's own reading: runs.load_runs, match.match's final value
    of each run, stats.seed_test's seed pairing and noise model (at every prefix of the paired seeds). Only
    finished runs are paired; others are counted in each contrast's note. Bonferroni over the K contrasts: each
    sequence at rule.alpha / K. runs: runs already loaded from runs_dir (the report passes its own). trained: when
    the study trained each seed (trained_order of study.json); each pair's prefixes follow it, never the seed
    numbers (a file's seeds 5, 6, 7 then seed 0: 0 is the fourth). Like with like as in the fixed report: a pair
    whose compared points fail match.token_gap (max_token_gap, default --max-token-gap's) is not decided; a variant
    with a failed or diverged seed is never decided better, nor equivalent (its survivors are a selected sample)."""
    from ablate.report.inference import families
    from ablate.report.inputs import match, tokenizers
    from ablate.report.inputs.runs import direction, load_runs, task_infos
    from ablate.text import natural_key

    if runs is None:
        runs, _ = load_runs(runs_dir)
    names = list(variants) if variants is not None else sorted({r.variant for r in runs}, key=natural_key)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    k = max(1, len(pairs) * len(rule.metrics))
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
            c = _contrast(a, b, shown, scores, rule, k, margin, direction(metric) < 0, task_key, order, gap)
            c.note = "; ".join(filter(None, [why, f"not decided: {refused}" if refused else c.note]))
            _never_better_on_survivors(c, failed)
            skipped = [f"{v}: seed{'s' * (len(unpaired[v]) > 1)} {_seeds(unpaired[v])}" for v in (a, b) if unpaired[v]]
            if skipped:
                c.note = "; ".join(filter(None, [c.note, "unfinished or failed, not paired: " + ", ".join(skipped)]))
            out.append(c)
    return out


def _never_better_on_survivors(c: Contrast, failed: dict[str, str]) -> None:
    """The fixed report's rule (families.winner's `never`) in an adaptive study: a variant with a failed or diverged
    seed is compared on its finished seeds, which survived a selection, so the contrast may find it worse but never
    better or equivalent (in place: such a decision becomes open, and the note says why)."""
    for v in (c.a, c.b):
        if v not in failed:
            continue
        wins = c.decision == "equivalent" or (c.decision in ("a", "b") and getattr(c, c.decision) == v)
        if wins:
            c.decision, c.decided_at = "open", None
        c.note = "; ".join(filter(None, [c.note, f"{v}: {failed[v]} (never decided better or equivalent)"]))


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


def _contrast(a, b, metric, scores, rule, k, margin, lower_is_better, task_key, order, max_token_gap) -> Contrast:
    from ablate.report.inference import stats
    from ablate.report.inputs import match

    contrast = Contrast(a, b, metric, "open", 0, None, None, margin)
    if scores is None or a not in scores or b not in scores:
        contrast.note = f"no {metric} in the finished runs of both variants"
        return contrast
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
        return contrast
    if task_key != "val_loss" and prefixes and not any(prefixes[-1][1:]):
        contrast.note = "no item-noise floor known (no per-item files or standard errors): a task metric cannot decide"
        return contrast
    contrast.looks = pair_looks(shared, order) if rule.design != "anytime" else []
    contrast.decision, contrast.interval, contrast.decided_at, contrast.boundary = decide_prefixes(
        prefixes, rule.alpha / k, margin, lower_is_better, rule, contrast.looks
    )
    return contrast


# ---------------------------------------------------------------------------------------------------------------
# the report's `sequential` section


def read_study(runs_dir) -> dict | None:
    """runs_dir/study.json as the driver wrote it, or None where there is no study. Raises ValueError naming the
    file when it cannot be read."""
    import json

    path = Path(runs_dir) / STUDY_FILE
    if not path.is_file():
        return None
    try:
        study = json.loads(path.read_text())
        DecisionRule.from_dict(study["rule"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a study record ({exc})") from None
    return study


def _study_variants(study: dict) -> list[str] | None:
    named = [v for r in study.get("rounds") or [] for v in (r.get("seeds") or {})]
    return list(dict.fromkeys(named)) or None


def _run_compute(run) -> tuple[float, float | None]:
    """(training tokens, device-seconds: wall time x devices) of one run, from its summary (else its last logged
    tokens, and no time)."""
    import json

    summary = run.summary or {}
    tokens = summary.get("tokens", run.train_loss[-1].tokens if run.train_loss else 0) or 0
    wall = summary.get("wall_seconds")
    if wall is None:
        return float(tokens), None
    from ablate import rundir

    devices = json.loads((run.path / rundir.CONFIG).read_text()).get("world_size") or 1
    return float(tokens), float(wall) * devices


def study_compute(runs, variants: list[str], max_seeds: int) -> dict:
    """Tokens and device-seconds of the study's runs, and their share of a fixed design of max_seeds seeds for every
    variant (each variant's runs costing what its runs cost on average)."""
    used_tokens, used_seconds, fixed_tokens, fixed_seconds = 0.0, 0.0, 0.0, 0.0
    timed = True
    for v in variants:
        costs = [_run_compute(r) for r in runs if r.variant == v]
        if not costs:
            continue
        tokens = [c[0] for c in costs]
        used_tokens += sum(tokens)
        fixed_tokens += max_seeds * sum(tokens) / len(tokens)
        seconds = [c[1] for c in costs if c[1] is not None]
        timed = timed and len(seconds) == len(costs)
        used_seconds += sum(seconds)
        fixed_seconds += max_seeds * sum(seconds) / len(seconds) if seconds else 0.0
    return {
        "tokens": int(used_tokens),
        "device_seconds": used_seconds if timed else None,
        "fixed_design_seeds": max_seeds,
        "fixed_design_tokens": int(fixed_tokens),
        "fixed_design_share": used_tokens / fixed_tokens if fixed_tokens else None,
        "fixed_design_share_time": used_seconds / fixed_seconds if timed and fixed_seconds else None,
    }


def study_section(runs, runs_dir, study: dict, max_token_gap: float | None = None) -> dict:
    """report.json's `sequential`: the contrasts recomputed from the run folders (study.json's own copies are not
    trusted) in the order the study trained its seeds, the rule and its history, the rounds, the compute used, and
    how the study stopped. max_token_gap: the report's --max-token-gap."""
    rule = DecisionRule.from_dict(study["rule"])
    variants = _study_variants(study)
    contrasts = study_contrasts(runs_dir, rule, variants, runs, trained_order(study), max_token_gap)
    names = variants or sorted({r.variant for r in runs})
    history = study.get("rule_history") or []
    after = [i for i, h in enumerate(history) if h.get("set_after_results")]
    changed = [(i, history[i]) for i in after if voids_guarantee(_changed_fields(history, i), _design(history, i))]
    return {
        "design": rule.design,
        "method": method_text(rule, len(contrasts)),
        "rule": rule.to_dict(),
        "rule_history": history,
        "rule_changed_after_results": bool(changed),
        "rule_changes": [_change_text(history, i) for i, _ in changed],
        "stopping_changes": [_change_text(history, i) for i in after if (i, history[i]) not in changed],
        "alpha": rule.alpha,
        "alpha_per_contrast": rule.alpha / max(1, len(contrasts)),
        "rounds": len(study.get("rounds") or []),
        "stopped": study.get("stopped"),
        "contrasts": [c.to_dict() for c in contrasts],
        "open": sorted(open_variants(contrasts)),
        "compute": study_compute(runs, names, rule.max_seeds),
    }


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


def method_text(rule: DecisionRule, contrasts: int) -> str:
    if rule.design == "anytime":
        g = ", ".join(f"{g:g}" for g in MIXTURE_G)
        return (
            f"anytime-valid t-test from e-values (group-invariant safe t-test, mixture over g {g}), Bonferroni over "
            f"{contrasts} contrast(s)"
        )
    futility = f", futility below {rule.futility:g} (non-binding)" if rule.futility else ""
    return (
        f"group-sequential t-test over looks up to {rule.max_seeds} seeds ({rule.spending} alpha spending on the "
        f"information fraction, boundaries calibrated for the t by simulation; repeated confidence intervals"
        f"{futility}), Bonferroni over {contrasts} contrast(s)"
    )


def _design(history: list[dict], i: int) -> str:
    """The design the study ran under before history entry i changed its rule."""
    return DecisionRule.from_dict(history[max(i - 1, 0)]["rule"]).design


def _changed_fields(history: list[dict], i: int) -> set[str] | None:
    """The rule fields history entry i changed from entry i - 1 (None for the first entry: the rule set)."""
    if not i:
        return None
    new, old = (DecisionRule.from_dict(history[k]["rule"]) for k in (i, i - 1))
    return set(new.changes_from(old, fields_only=True))


def _change_text(history: list[dict], i: int) -> str:
    """'after round 2: alpha: 0.05 -> 0.1' for the rule history's entry i (set after results were seen)."""
    new = DecisionRule.from_dict(history[i]["rule"])
    what = "; ".join(new.changes_from(DecisionRule.from_dict(history[i - 1]["rule"]))) if i else "set"
    return f"after round {history[i].get('round')}: {what or 'unchanged'}"
