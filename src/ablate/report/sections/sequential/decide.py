"""An adaptive study's decisions: each contrast decided under its design, Holm's recycling over the contrasts.

Across the K contrasts of a study (pairs x decision metrics): under the anytime design Bonferroni, each contrast at
alpha / K: it holds under any dependence between contrasts (they share variants and seeds): with probability >= 1 -
alpha every interval of every contrast covers its true difference at every round, and a wrong decision needs a miss.
Under the group-sequential design Holm's recycling (decide_study): each contrast starts at alpha / K, and once r are
decided on a side the others are judged at alpha / (K - r), every look at the boundaries of that level (Maurer and
Bretz 2013); a decided contrast's alpha passes to those still open.

Noise model (noise.seed_test's, the fixed report's): the mean difference's variance is max(s^2, fresh) / n +
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
from dataclasses import asdict, dataclass, field

from ablate.report.sections.sequential.rule import DecisionRule
from ablate.report.stats import group_sequential
from ablate.report.stats.anytime import running_interval

FUTILE = "futile"  # a decision: closed for futility (its estimated chance of a decision fell below rule.futility)
OLD_FUTILE = "undecidable"  # the same decision as study.json files written before 2026-11-27 name it
CLOSED = (FUTILE, OLD_FUTILE)  # a recorded decision that reads "closed for futility"


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
    from ablate.report.stats.power import t_power

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
