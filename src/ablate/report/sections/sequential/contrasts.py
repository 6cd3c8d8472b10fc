"""An adaptive study's contrasts from its runs, read as the fixed report reads them: every pair of variants on
every decision metric, each pair's seeds in the order the study trained them, then decided (decide.py)."""

from __future__ import annotations

import math

from ablate.report.sections.sequential.decide import Contrast, decide_contrast, decide_study, fixed_power
from ablate.report.sections.sequential.rule import DecisionRule, metric_key


def study_contrasts(
    runs,
    rule: DecisionRule,
    variants: list[str] | None = None,
    trained: dict[str, dict[int, tuple[int, int]]] | None = None,
    max_token_gap: float | None = None,
) -> list[Contrast]:
    """Every pair of `variants` (default: every variant of the runs) x every decision metric of the rule, decided
    from the study's runs (as inputs/runs.load_runs reads them from its run folders: section.folder_contrasts)
    through the fixed report's own reading: match.match's final value of each run, noise.seed_test's seed pairing and
    noise model (at every prefix of the paired seeds). Only finished runs are paired; others are counted in each
    contrast's note. Over the K contrasts: Holm's recycling under the group-sequential design, Bonferroni (rule.alpha
    / K each) under the anytime one (decide_study). trained: when the study trained each seed (trained_order of
    study.json); each pair's prefixes follow it, never the seed numbers (a file's seeds 5, 6, 7 then seed 0: 0 is
    the fourth). Like with like as in the fixed report: a pair whose compared points fail match.token_gap
    (max_token_gap, default --max-token-gap's) is not decided; a variant with a failed or diverged seed is never
    decided better, nor equivalent (its survivors are a selected sample)."""
    from ablate.report.inputs import failures, match, tokenizers
    from ablate.report.inputs.runs import direction, task_infos
    from ablate.text import natural_key

    names = list(variants) if variants is not None else sorted({r.variant for r in runs}, key=natural_key)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    finished = {v: [r for r in runs if r.variant == v and r.status == "finished"] for v in names}
    unpaired = {v: sorted(r.seed for r in runs if r.variant == v and r.status != "finished") for v in names}
    failed = failures.failure_texts(failures.failed_seeds({v: [r for r in runs if r.variant == v] for v in names}))
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
            c.note = _pair_note(c.note, why, refused, (a, b), failed, unpaired)
            out.append((c, inputs))
    return _decided(out, rule, failed)


def _pair_note(note: str, why: str, refused: str | None, pair: tuple[str, str], failed: dict, unpaired: dict) -> str:
    """A contrast's note: how it is compared (why), why it is not decided (refused), its variants' failed or
    diverged seeds (never decided better or equivalent) and the seeds left unpaired."""
    note = "; ".join(filter(None, [why, f"not decided: {refused}" if refused else note]))
    never = [f"{v}: {failed[v]} (never decided better or equivalent)" for v in pair if v in failed]
    note = "; ".join(filter(None, [note, *never]))
    skipped = [f"{v}: seed{'s' * (len(unpaired[v]) > 1)} {_seeds(unpaired[v])}" for v in pair if unpaired[v]]
    if skipped:
        note = "; ".join(filter(None, [note, "unfinished or failed, not paired: " + ", ".join(skipped)]))
    return note


def _decided(out: list[tuple[Contrast, tuple | None]], rule: DecisionRule, failed: dict) -> list[Contrast]:
    """The contrasts decided together (decide_study: Holm's recycling, or Bonferroni under the anytime design)."""

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
    from ablate.report.stats import noise  # seed_test, read as the fixed report reads it
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
        t = noise.seed_test({s: sa[s] for s in keep}, {s: sb[s] for s in keep}, rows_a, rows_b, ea, eb)
        floors = [(sd or 0.0) ** 2 for sd in (t.noise_floor_sd, t.item_sd)]
        prefixes.append(([sa[s] - sb[s] for s in keep], *floors))
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
