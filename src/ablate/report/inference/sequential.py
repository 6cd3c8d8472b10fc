"""Adaptive studies (`ablate run --until-decided`): the decision rule, anytime-valid intervals, decisions.

A study trains its variants in rounds and, after each, asks of every contrast (a pair of variants on a decision
metric) whether it is decided. The seeds seen so far are a prefix of one sequence, the seeds in the order the study
trained them (its recorded rounds, never their numbers: a seed trained later is appended, never inserted before the
others; the value a seed gives never depends on the study's decisions), so an interval that covers the true
difference at every prefix at once stays valid whenever the study stops, for whatever reason, and however often it
looked.

Method: the anytime-valid t-test built from e-values, the group-invariant ("safe") t-test of Perez-Ortiz, Lardy,
de Heide and Grunwald (2022, "E-statistics, group invariance and anytime valid testing", arXiv:2208.07610). For n
paired per-seed differences with mean m and variance s^2, t = (m - mu0) / sqrt(s^2 / n) on nu = n - 1 degrees of
freedom. The Bayes factor of t with the right-Haar prior on the scale and a normal prior N(0, g) on the
standardized effect mu / sigma is (Gonen, Johnson, Lu and Westfall 2005, "The Bayesian two-sample t test")

    BF_g(t) = (1 + n g)^(-1/2) * ((1 + t^2 / nu) / (1 + t^2 / (nu (1 + n g))))^((nu + 1) / 2),

a test martingale in n >= 2 under mu = mu0 on the filtration of the scale-invariant statistic (the paper's Theorem
for group-invariant e-processes). An average of test martingales is one, so the e-value used is the mean over
g in MIXTURE_G = (1, 10, 100, 1000): the large g let a huge effect decide at 3 seeds (at n = 3, BF_g's supremum over
t is 1 + 3 g, so the mixture's is 834), the small ones keep power for moderate effects at more seeds.

Confidence sequence: {mu0 : E_n(mu0) < 1 / alpha}. BF_g grows with |t|, so this is m +- t* sqrt(s^2 / n), t* the
solution of E(t*) = 1 / alpha (unbounded where the supremum at n stays below 1 / alpha: at 2 seeds always, at 3
seeds where alpha <= 1/834). By Ville's inequality, P(some n has E_n(mu_true) >= 1 / alpha) <= alpha: every
interval of the sequence covers the truth at once with probability >= 1 - alpha, whatever the stopping rule.
The interval a study reports is the running intersection over its prefixes (n = 2, 3, ...), which keeps the
guarantee and never lets a decision made at one round be taken back at a later one.

Across the K contrasts of a study (pairs x decision metrics): Bonferroni, each sequence at alpha / K. It holds
under any dependence between contrasts (they share variants and seeds) and, since each sequence is time-uniform,
time-uniformly too: with probability >= 1 - alpha every interval of every contrast covers its true difference at
every round. A wrong decision needs a miss, so alpha bounds the chance of any wrong winner or wrong equivalence.

Noise model (stats.seed_test's, the fixed report's): the mean difference's variance is max(s^2, fresh) / n +
item_var, fresh the items' fresh answer noise in one run-level difference (a floor on s^2: accuracies move in steps,
so a few seeds sometimes agree exactly by chance) and item_var the persistent item-set part, the same on every seed
and so not divided by the seeds (a difference every seed repeats is evidence only as far as its items are). The t
uses s^2_eff = max(s^2, fresh) + n item_var on n - 1 degrees of freedom. A larger variance only lowers |t| and so the
e-value; the item term is a fixed-sample estimate, the same at every look. Per-seed differences with no spread and
no known item noise give no interval (open).

Decision of a contrast: "equivalent" when its interval lies inside (-margin, +margin) (checked first), else the
better side when it excludes 0, else "open".
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from ablate.rundir import STUDY

STUDY_FILE = STUDY  # runs/<experiment>/study.json: the rule, its history and the rounds (written by the driver)
MIXTURE_G = (1.0, 10.0, 100.0, 1000.0)  # prior variances of the standardized effect, equally weighted
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
    most. budget: "" (none), training tokens ("2e8", "500M"), or hours of compute ("3h": wall time x devices)."""

    metrics: tuple[str, ...] = ("val_loss",)
    margins: dict[str, float] = field(default_factory=dict)
    alpha: float = 0.05
    max_seeds: int = 8
    budget: str = ""

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
        try:
            if not isinstance(self.budget, str):
                raise ValueError(self.budget)
            parse_budget(self.budget)
        except ValueError:
            raise ValueError(
                f"{where}: budget={self.budget!r}; allowed: '' (none), training tokens ('2e8', '500M', '1.5B') or "
                f"hours of compute, wall time x devices ('3h')"
            ) from None

    def changes_from(self, other: DecisionRule) -> list[str]:
        """What differs from `other`, one "field: other's -> this one's" each (["alpha: 0.05 -> 0.1"]); [] when
        equal."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [f"{k}: {_shown(theirs[k])} -> {_shown(mine[k])}" for k in mine if mine[k] != theirs[k]]


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
    decision: str  # "a" (a better), "b" (b better), "equivalent", "open"
    seeds: int  # paired seeds used
    interval: tuple[float, float] | None
    estimate: float | None  # mean(a - b)
    margin: float | None
    decided_at: int | None = None  # the paired seeds at which it was first decided
    note: str = ""  # why it cannot decide (no floor for a task metric, a metric missing), unpaired runs

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.interval is not None:  # JSON has no infinity: an unbounded end is null
            d["interval"] = [x if math.isfinite(x) else None for x in self.interval]
        return d


# ---------------------------------------------------------------------------------------------------------------
# the e-value and its confidence sequence


def log_bayes_factor(t: float, n: int, g: float) -> float:
    """log BF_g(t) for n >= 2 observations (formula in the module docstring)."""
    nu = n - 1
    return -0.5 * math.log1p(n * g) + (nu + 1) / 2 * (math.log1p(t * t / nu) - math.log1p(t * t / (nu * (1 + n * g))))


def _log_mean_exp(logs: list[float]) -> float:
    top = max(logs)  # in logs: e-values at many seeds overflow a float
    return top + math.log(sum(math.exp(x - top) for x in logs) / len(logs))


def log_e_value(t: float, n: int) -> float:
    """log of the mixture e-value: the mean of BF_g(t) over MIXTURE_G."""
    return _log_mean_exp([log_bayes_factor(t, n, g) for g in MIXTURE_G])


def e_value(t: float, n: int) -> float:
    return math.exp(log_e_value(t, n))


def log_e_value_sup(n: int) -> float:
    """log of the largest e-value n observations can give (|t| -> infinity): the mean of (1 + n g)^((n - 1) / 2)."""
    return _log_mean_exp([(n - 1) / 2 * math.log1p(n * g) for g in MIXTURE_G])


def e_value_sup(n: int) -> float:
    return math.exp(log_e_value_sup(n))


@lru_cache(maxsize=4096)
def critical_t(n: int, alpha: float) -> float:
    """t* with e_value(t*, n) = 1 / alpha: the interval's half-width in standard errors; infinite where no t
    reaches 1 / alpha at n."""
    from scipy.optimize import brentq

    log_threshold = -math.log(alpha)
    if n < 2 or log_e_value_sup(n) <= log_threshold:
        return math.inf
    hi = 1.0
    while log_e_value(hi, n) < log_threshold:
        hi *= 2
    return brentq(lambda t: log_e_value(t, n) - log_threshold, 0.0, hi, xtol=1e-10, rtol=1e-12)


def confidence_sequence(
    diffs, alpha: float, floor_var: float = 0.0, item_var: float = 0.0
) -> tuple[float, float] | None:
    """The interval for the mean of `diffs` (per-seed differences, in seed order) at n = len(diffs), one member of a
    sequence covering the mean at every n at once with probability >= 1 - alpha (alpha: this sequence's own level,
    the study's alpha / K). floor_var: the fresh answer noise of one run-level difference (floors the per-seed
    variance); item_var: the persistent item-set variance of the mean difference, which seeds do not average away
    (the mean's variance is max(s^2, floor_var) / n + item_var). None for fewer than 2 differences or no variance
    at all; (-inf, inf) where n cannot reach 1 / alpha."""
    values = [float(x) for x in diffs]
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    var = max(sum((x - mean) ** 2 for x in values) / (n - 1), floor_var or 0.0) + n * (item_var or 0.0)
    if not var > 1e-30:  # equal differences and no item noise known: no evidence of how far they may move
        return None
    half = critical_t(n, alpha) * math.sqrt(var / n)
    return mean - half, mean + half


def running_interval(prefixes: list[tuple], alpha: float) -> tuple[float, float] | None:
    """The intersection of the sequence's intervals over prefixes [(diffs of the first n seeds, floor_var,
    item_var), ...] (n rising; item_var may be left out: 0): still covering at every n with probability >= 1 -
    alpha, and never widening. An empty intersection (possible only where coverage failed) leaves the newest
    interval."""
    out = None
    for diffs, *noise in prefixes:
        now = confidence_sequence(diffs, alpha, *noise)
        if now is None:
            continue
        both = now if out is None else (max(out[0], now[0]), min(out[1], now[1]))
        out = both if both[0] <= both[1] else now
    return out


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
    prefixes: list[tuple], alpha: float, margin: float | None, lower_is_better: bool
) -> tuple[str, tuple[float, float] | None, int | None]:
    """The decision after the last prefix, its running interval, and the paired seeds at which it was first made
    (a decision, once made, is kept: the interval only narrows)."""
    interval, decided_at = None, None
    for k in range(len(prefixes)):
        interval = running_interval(prefixes[: k + 1], alpha)
        if decided_at is None and decide(interval, margin, lower_is_better) != "open":
            decided_at = len(prefixes[k][0])
    return decide(interval, margin, lower_is_better), interval, decided_at


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
            c = _contrast(a, b, shown, scores, rule.alpha / k, margin, direction(metric) < 0, task_key, order, gap)
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


def _contrast(a, b, metric, scores, alpha, margin, lower_is_better, task_key, order, max_token_gap) -> Contrast:
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
    contrast.decision, contrast.interval, contrast.decided_at = decide_prefixes(
        prefixes, alpha, margin, lower_is_better
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
    changed = [(i, history[i]) for i in after if voids_guarantee(_changed_fields(history, i))]
    return {
        "method": "anytime-valid t-test from e-values (group-invariant safe t-test, mixture over g "
        f"{', '.join(f'{g:g}' for g in MIXTURE_G)}), Bonferroni over {len(contrasts)} contrast(s)",
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


# Where a study stops does not touch the anytime-valid design's guarantee: Ville's inequality holds at any stopping
# time, so raising (or lowering) max_seeds after results is no change of the decision rule. A group-sequential
# design (looks fixed in advance, alpha spent per look) would refuse it: its entry here would be empty.
STOPPING_ONLY = {"anytime": frozenset({"max_seeds"})}


def voids_guarantee(fields: set[str], design: str = "anytime") -> bool:
    """Whether changing these rule fields after results were seen voids the study's error guarantee under `design`
    (None for a rule first set after results: it does)."""
    return fields is None or not fields <= STOPPING_ONLY.get(design, frozenset())


def _changed_fields(history: list[dict], i: int) -> set[str] | None:
    """The rule fields history entry i changed from entry i - 1 (None for the first entry: the rule set)."""
    if not i:
        return None
    new, old = (DecisionRule.from_dict(history[k]["rule"]).to_dict() for k in (i, i - 1))
    return {k for k in new if new[k] != old[k]}


def _change_text(history: list[dict], i: int) -> str:
    """'after round 2: alpha: 0.05 -> 0.1' for the rule history's entry i (set after results were seen)."""
    new = DecisionRule.from_dict(history[i]["rule"])
    what = "; ".join(new.changes_from(DecisionRule.from_dict(history[i - 1]["rule"]))) if i else "set"
    return f"after round {history[i].get('round')}: {what or 'unchanged'}"
