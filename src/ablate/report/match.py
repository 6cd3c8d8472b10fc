"""Like with like: which evaluation of each run a comparison uses, and over which items.

- Equal tokens: runs of one comparison may differ in batch size or sequence length, so a step means different
  amounts of training. Finals are taken at the largest token count every compared run reached: each run's
  evaluation at or just before it (runs that all end at the same token count keep their last evaluation).
- Identical items: a run re-scored with `ablate eval --limit 50` holds 50-item scores where the others hold 200.
  Scores are compared only over the item ids every run scored: the intersection when it is large enough, else
  the task is left out. Either way the mismatch is named (which runs, how many items each).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from ablate.report.load import Point, Run, TaskInfo


@dataclass
class Matched:
    points: dict[str, Point]  # run label -> the evaluation compared
    tokens: int | None  # the token count compared at; None: token counts unknown, last evaluations
    at_last: bool  # every run's compared evaluation is its last one
    ids: list[str] | None  # item ids compared; None: not every run has per-item files
    values: dict[str, dict[str, float]] | None  # run label -> {item id: value}, over `ids`
    mismatch: dict | None  # {"task", "runs": {label: items}, "shared": k, "kept": bool, "text": ...}
    left_out: str | None  # why this comparison cannot be made

    def score(self, label: str) -> float:
        """A run's score: its mean over the compared items, else the value its evaluation logged."""
        if self.values is not None and self.ids:
            return float(sum(self.values[label][i] for i in self.ids) / len(self.ids))
        return self.points[label].value


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


def _by_count(counts: dict[str, int]) -> str:
    groups: dict[int, list[str]] = {}
    for label, n in counts.items():
        groups.setdefault(n, []).append(label)
    parts = []
    for n, labels in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shown = ", ".join(labels[:4]) + (f" (+{len(labels) - 4} more)" if len(labels) > 4 else "")
        parts.append(f"{n} items: {shown}")
    return "; ".join(parts)


def match(runs: list[Run], task: TaskInfo, metric: str, min_share: float) -> Matched:
    """The evaluations and items a comparison of `runs` on (task, metric) uses. min_share: the intersection of
    item ids must hold at least this share of the smallest run's items (and >= 2 items) to be used."""
    key = (task.key, metric)
    points, tokens, at_last = final_points(runs, key)
    values: dict[str, dict[str, float]] | None = {}
    for run in runs:
        rows = run.items(task, points[run.label].step)
        if not rows or any(not isinstance(r.get(metric), (int, float)) or not math.isfinite(r[metric])
                           for r in rows.values()):
            values = None
            break
        values[run.label] = {i: float(r[metric]) for i, r in rows.items()}
    out = Matched(points, tokens, at_last, None, None, None, None)
    if values is None:  # no item ids to match: at least the logged item counts must agree
        counts = {label: p.n for label, p in points.items() if p.n is not None}
        if len(set(counts.values())) > 1:
            out.mismatch = {"task": task.key, "runs": counts, "shared": None, "kept": False,
                            "text": f"{task.key}: runs scored different numbers of items ({_by_count(counts)}) and "
                                    f"have no per-item files to match them: left out"}
            out.left_out = out.mismatch["text"]
        return out
    sets = {label: set(v) for label, v in values.items()}
    first = next(iter(sets.values()))
    if all(s == first for s in sets.values()):
        out.ids, out.values = sorted(first), values
        return out
    shared = set.intersection(*sets.values())
    smallest = min(len(s) for s in sets.values())
    kept = len(shared) >= 2 and len(shared) >= min_share * smallest
    counts = {label: len(s) for label, s in sets.items()}
    same_count = len(set(counts.values())) == 1
    what = (f"different item ids ({smallest} each)" if same_count else f"different items ({_by_count(counts)})")
    text = f"{task.key}: runs scored {what}; " + (
        f"compared over the {len(shared)} items all of them share" if kept else
        f"only {len(shared)} items are shared (< {min_share:g} of the smallest set): left out")
    out.mismatch = {"task": task.key, "runs": counts, "shared": len(shared), "kept": kept, "text": text}
    if kept:
        out.ids, out.values = sorted(shared), {k: {i: v[i] for i in shared} for k, v in values.items()}
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
    return (f"{tokens:,} tokens, the most every run reached (each run's evaluation at or just before it: "
            + ", ".join(f"{t:,}" for t in used) + " tokens)")
