"""Like with like: which evaluation of each run a comparison uses, and over which items.

- Equal tokens: runs of one comparison may differ in batch size or sequence length, so a step means different
  amounts of training. Finals are taken at the largest token count every compared run reached: each run's
  evaluation at or just before it (runs that all end at the same token count keep their last evaluation). A pair
  whose compared points lie further apart than `--max-token-gap`, or where a count is missing, is not tested
  (`token_gap`: the one rule of the fixed report and the adaptive study).
- Identical items: a run re-scored with `ablate eval --limit 50` holds 50-item scores where the others hold 200.
  Scores are compared only over the item ids every run scored: the intersection when it is large enough, else
  the task is left out. Either way the mismatch is named (which runs, how many items each).
- Averaged last evaluations (`--average-last K`): a run's score is the mean of its last K evaluations up to the
  compared one, per item where per-item files exist (Signal and Noise: averaging checkpoints cuts noise).
- Groups (MMLU's subjects): a task averaged over groups scores each run as the mean over groups of the group's
  mean, so per-item values are weighted to make their plain mean that macro average; groups a floor left out
  (signal/subjects.py) are left out of the items too.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ablate.report.inputs.runs import Point, Run, TaskInfo

# The report schema is imported where a mismatch is made (match): every command's parser reads MAX_TOKEN_GAP from
# here (report.options), and the whole schema took ~0.1 s of each command's start.
if TYPE_CHECKING:
    from ablate.report.schema import ItemMismatch

MAX_TOKEN_GAP = 0.05  # default --max-token-gap: compared points further apart in tokens (relative) are not compared


@dataclass
class Matched:
    points: dict[str, Point]  # run label -> the evaluation compared
    tokens: int | None  # the token count compared at; None: token counts unknown, last evaluations
    at_last: bool  # every run's compared evaluation is its last one
    ids: list[str] | None  # item ids compared; None: not every run has per-item files
    values: dict[str, dict[str, float]] | None  # run label -> {item id: value}, over `ids`
    mismatch: ItemMismatch | None  # the runs scored different items: how many each, shared, kept or left out
    left_out: str | None  # why this comparison cannot be made
    windows: dict[str, list[Point]] = field(default_factory=dict)  # run label -> the evaluations averaged, last
    # `points`; one evaluation unless --average-last

    def score(self, label: str) -> float:
        """A run's score: its mean over the compared items (each item's mean over the averaged evaluations), else
        the mean of the values its averaged evaluations logged."""
        if self.values is not None and self.ids:
            return float(sum(self.values[label][i] for i in self.ids) / len(self.ids))
        window = self.windows.get(label) or [self.points[label]]
        return float(sum(p.value for p in window) / len(window))


def final_points(runs: list[Run], key) -> tuple[dict[str, Point], int | None, bool]:
    """Each run's evaluation at or just before the largest token count that every run reached."""
    last = {r.label: r.scores[key][-1] for r in runs}
    if any(not p.tokens or p.tokens <= 0 for p in last.values()):
        return last, None, True
    target = min(p.tokens for p in last.values())
    chosen = {}
    for run in runs:
        before = [p for p in run.scores[key] if p.tokens <= target]
        if not before:  # a run first evaluated past where another stopped: no common point
            return last, None, True
        chosen[run.label] = before[-1]
    return chosen, target, all(chosen[k] is last[k] for k in last)


def token_gap(tokens: list, max_gap: float) -> tuple[float | None, str | None]:
    """Like with like in tokens for one pair, the rule the fixed report and the adaptive study both apply: the token
    counts of the compared points of both variants' runs -> (their gap (max - min) / max, why the pair is not tested
    or None). A count missing (None or 0: not logged) leaves the gap unknown, so the pair is not tested either: one
    run without a count must not switch the check off."""
    missing = sum(1 for t in tokens if not t or t <= 0)
    if missing:
        return None, f"token count not logged for {missing} of {len(tokens)} compared runs (equal tokens unchecked)"
    gap = (max(tokens) - min(tokens)) / max(tokens) if tokens else 0.0
    if gap <= max_gap:
        return gap, None
    why = f"compared at {min(tokens):,} to {max(tokens):,} tokens, {gap:.0%} apart (> {max_gap:.0%}: --max-token-gap)"
    return gap, why


def _by_count(counts: dict[str, int]) -> str:
    groups: dict[int, list[str]] = {}
    for label, n in counts.items():
        groups.setdefault(n, []).append(label)
    parts = []
    for n, labels in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(labels[:4]) + (f" (+{len(labels) - 4} more)" if len(labels) > 4 else "")
        parts.append(f"{n} items: {shown}")
    return "; ".join(parts)


def _window(points: list[Point], last: Point, k: int) -> list[Point]:
    """The last k evaluations of a run up to `last` (fewer when the run has fewer)."""
    upto = [p for p in points if p.step <= last.step]
    return upto[-max(1, k) :]


def _item_values(run: Run, task: TaskInfo, metric: str, step: int) -> tuple[dict, dict] | None:
    """({item id: value}, {item id: group}) of one evaluation, or None when the run has no usable per-item file (or,
    for a metric whose groups a floor cut, rows that do not say their group)."""
    rows = run.items(task, step)
    if not rows:
        return None
    values = {i: r.get(metric) for i, r in rows.items()}
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values.values()):
        return None
    group_of = {}
    if task.groups:  # rows of a task averaged over groups say their group ("subject": an older spelling)
        group_of = {i: str(g) for i, r in rows.items() if (g := r.get("group", r.get("subject"))) is not None}
    kept = task.kept_groups.get(metric)
    if kept is not None:
        if len(group_of) < len(rows):
            return None
        values = {i: v for i, v in values.items() if group_of[i] in kept}
    return {i: float(v) for i, v in values.items()}, group_of


def _averaged(evals: list[dict]) -> dict[str, float]:
    """Each item's mean over several evaluations of one run (the items all of them scored)."""
    if len(evals) == 1:
        return evals[0]
    ids = set.intersection(*(set(e) for e in evals))
    return {i: sum(e[i] for e in evals) / len(evals) for i in ids}


def _macro_weights(values: dict[str, dict[str, float]], ids: list[str], group_of: dict) -> dict:
    """Values weighted so that their plain mean over `ids` is the mean over groups of each group's mean."""
    counts = Counter(group_of[i] for i in ids)
    w = {i: len(ids) / (len(counts) * counts[group_of[i]]) for i in ids}
    return {label: {i: v[i] * w[i] for i in ids} for label, v in values.items()}


def match(runs: list[Run], task: TaskInfo, metric: str, min_share: float, average_last: int = 1) -> Matched:
    """The evaluations and items a comparison of `runs` on (task, metric) uses. min_share: the intersection of
    item ids must hold at least this share of the smallest run's items (and >= 2 items) to be used. average_last:
    each run's last this many evaluations up to the compared one are averaged."""
    from ablate.report.schema import ItemMismatch

    key = (task.key, metric)
    points, tokens, at_last = final_points(runs, key)
    windows = {r.label: _window(r.scores[key], points[r.label], average_last) for r in runs}
    values: dict[str, dict[str, float]] | None = {}
    group_of: dict = {}
    for run in runs:
        evals = [_item_values(run, task, metric, p.step) for p in windows[run.label]]
        if any(e is None for e in evals):
            values = None
            break
        values[run.label] = _averaged([e[0] for e in evals])
        for _, groups in evals:
            group_of.update(groups)
    out = Matched(points, tokens, at_last, None, None, None, None, windows)
    grouped = bool(task.groups) and values is not None and all(i in group_of for v in values.values() for i in v)
    if values is None:  # no item ids to match: at least the logged item counts must agree
        counts = {label: p.n for label, p in points.items() if p.n is not None}
        if len(set(counts.values())) > 1:
            text = (
                f"{task.key}: runs scored different numbers of items ({_by_count(counts)}) and have no per-item "
                f"files to match them: left out"
            )
            out.mismatch = ItemMismatch(task=task.key, runs=counts, shared=None, kept=False, text=text)
            out.left_out = text
        return out
    sets = {label: set(v) for label, v in values.items()}
    first = next(iter(sets.values()))
    if all(s == first for s in sets.values()):
        out.ids, out.values = sorted(first), values
        if grouped:
            out.values = _macro_weights(values, out.ids, group_of)
        return out
    shared = set.intersection(*sets.values())
    smallest = min(len(s) for s in sets.values())
    kept = len(shared) >= 2 and len(shared) >= min_share * smallest
    counts = {label: len(s) for label, s in sets.items()}
    same_count = len(set(counts.values())) == 1
    what = f"different item ids ({smallest} each)" if same_count else f"different items ({_by_count(counts)})"
    text = f"{task.key}: runs scored {what}; " + (
        f"compared over the {len(shared)} items all of them share"
        if kept
        else f"only {len(shared)} items are shared (< {min_share:g} of the smallest set): left out"
    )
    out.mismatch = ItemMismatch(task=task.key, runs=counts, shared=len(shared), kept=kept, text=text)
    if kept:
        out.ids, out.values = sorted(shared), {k: {i: v[i] for i in shared} for k, v in values.items()}
        if grouped:
            out.values = _macro_weights(out.values, out.ids, group_of)
    else:
        out.left_out = text
    return out


def shape_differences(runs: list[Run]) -> dict[str, dict]:
    """Config fields that change how many tokens a step is (train.global_batch, data.seq_len) and differ between
    runs: {field: {value: [variant, ...]}}."""
    out = {}
    for section, name in (("train", "global_batch"), ("data", "seq_len")):
        values: dict[str, list[str]] = {}
        for run in runs:
            value = str(run.config.get(section, {}).get(name))
            if run.variant not in values.setdefault(value, []):
                values[value].append(run.variant)
        if len(values) > 1:
            out[f"{section}.{name}"] = values
    return out


def token_note(points: dict[str, Point], tokens: int | None, at_last: bool) -> str:
    if tokens is None:
        return "each run's last evaluation (token counts not logged)"
    if at_last:
        return f"each run's last evaluation ({tokens:,} tokens)"
    used = sorted(Counter(p.tokens for p in points.values()))
    if used == [tokens]:
        return f"{tokens:,} tokens, the most every run reached"
    return (
        f"{tokens:,} tokens, the most every run reached (each run's evaluation at or just before it: "
        + ", ".join(f"{t:,}" for t in used)
        + " tokens)"
    )
