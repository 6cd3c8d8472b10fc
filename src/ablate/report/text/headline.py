"""The decisions in words: one sentence per decision metric, the headline, and an adaptive study's decisions leading
it.

A sentence claims only pairs that were tested (the leader against each other variant, and any other significant
pair); where a pair is open it says how many seeds would settle it (inference/families.py's seeds needed).
"""

from __future__ import annotations

from ablate.report.text.fmt import seeds_needed
from ablate.report.text.verdict import verdict as short_verdict
from ablate.report.inference.families import failure_texts, metric_label, winner
from ablate.report.inference.pairs import best
from ablate.report.inputs.runs import VAL_TASK, sign_of


def _gap(p: dict, leader: str, sign: int) -> float:
    """How far `leader` is ahead in a pairwise row (oriented: > 0 ahead), from the pair's own estimate: the mean
    per-seed difference over the seeds both ran."""
    return sign * (p["diff"] if p["a"] == leader else -p["diff"])


def _p(x, op: str = "=") -> str:
    """p_BH=0.003, p_BH<0.001, or with op "<=" a bound over several pairs."""
    return "p_BH n/a" if x is None else "p_BH<0.001" if x < 0.001 else f"p_BH{op}{x:.2g}"


def needed_text(row: dict) -> str:
    """'~13 seeds needed (6 to 210 within the sd's uncertainty)' for a pair's seeds-needed estimate."""
    if row.get("more_items"):
        return "more items, not more seeds: the item set's own noise hides a difference this size at any seed count"
    found = seeds_needed(row, "more than ")
    if found is None:
        return "seed spread unknown"
    need, span = found
    return f"~{need} seeds needed" + (f" ({span[0]} to {span[1]} within the sd's uncertainty)" if span else "")


def _others_clause(s: dict, leader: str, rest: list[str]) -> str:
    """What the tests say about the pairs that do not involve the leader: each significant one, or that none is."""
    found = [
        p
        for p in s["pairwise"]
        if leader not in (p["a"], p["b"]) and p["significant"] and p["better"] in (p["a"], p["b"])
    ]
    if found:
        return "; also " + ", ".join(
            f"{p['better']} ahead of {p['b'] if p['better'] == p['a'] else p['a']} ({_p(p['p_bh'])})" for p in found
        )
    return f"; {', '.join(rest)} not separated" if len(rest) >= 2 else ""


def _open_pair(leader: str, other: str | None, vs: dict[str, dict]) -> dict | None:
    """The leader's pair with `other` as the decisions table shows it (None: every pair of the leader decided)."""
    if other is None:
        return None
    row = vs[other]
    keep = ("p_bh", "testable", "untested", "note", "seeds_needed", "seeds_needed_range", "more_items")
    return {"a": leader, "b": other} | {k: row.get(k) for k in keep}


def decide_series(s: dict, opts) -> dict | None:
    """The decision on one metric: leader, the variants it is significantly ahead of, and one sentence that claims
    only pairs that were tested (the leader against each other variant, and any other significant pair)."""
    sign = sign_of(s["direction"])
    variants = list(s["final"])
    if len(variants) < 2:
        return None
    top = best(s)
    leader = top or sorted(variants, key=lambda v: -sign * s["final"][v]["mean"])[0]  # a tie: either is named
    rest = [v for v in variants if v != leader]  # in the variants' own (natural) order, which a reader can scan
    vs = {o: next(p for p in s["pairwise"] if {p["a"], p["b"]} == {leader, o}) for o in rest}
    order = [leader] + sorted(rest, key=lambda o: _gap(vs[o], leader, sign))  # stable: ties keep natural order
    runner = order[1]  # the runner-up: the closest pair, by its paired estimate
    beaten = [o for o in rest if vs[o]["significant"] and vs[o]["better"] == leader]
    level = [o for o in rest if o not in beaten]
    seeds = min(len(s["final"][v]["seeds"]) for v in variants)
    name, close = metric_label(s), vs[runner]
    out = {
        "task": s["task"],
        "metric": s["metric"],
        "name": name,
        "direction": s["direction"],
        "leader": leader,
        "ahead_of": beaten,
        "not_separated_from": level,
        "seeds": seeds,
        "seeds_needed": close["seeds_needed"],
        "seeds_needed_range": close.get("seeds_needed_range"),
        "p_bh": {o: vs[o]["p_bh"] for o in order[1:]},
        # the significant pairs [better, worse], and the leader's closest pair not decided: the decisions table
        "decided": [
            [p["better"], p["b"] if p["better"] == p["a"] else p["a"]] for p in s["pairwise"] if p["significant"]
        ],
        "closest_open": _open_pair(leader, next((o for o in order[1:] if o in level), None), vs),
        "status": None,
        "text": "",
    }
    plural = "s" * (seeds != 1)
    if top is None:
        out["status"], out["text"] = "tie", f"{name}: tie at the top ({leader}, {runner})"
    elif not close["testable"]:
        out["status"] = "too_few_seeds" if close["untested"] == "seeds" else "not_tested"
        why = needed_text(close) if close["untested"] == "seeds" else close["note"].removeprefix("not tested: ")
        out["text"] = f"{name}: {leader} ahead, not established with {seeds} seed{plural} ({why})"
    elif not level:
        worst = max(vs[o]["p_bh"] for o in order[1:])
        out["status"] = "best"
        out["text"] = (
            f"{name}: {leader} best{', ahead of ' + ', '.join(rest) if len(rest) > 1 else ''} "
            f"({_p(worst, '=' if len(rest) == 1 else '<=')}, {seeds} seeds)" + _others_clause(s, leader, rest)
        )
    elif not beaten:
        out["status"] = "no_difference"
        need = close["seeds_needed"]
        how = f"; {needed_text(close)}" if need is not None and need > seeds else ""
        out["text"] = (
            f"{name}: no significant difference ({leader} vs {runner} {_p(close['p_bh'])}, {seeds} seeds{how})"
        )
    else:
        worst = max(vs[o]["p_bh"] for o in beaten)
        out["status"] = "ahead"
        out["text"] = (
            f"{name}: {leader} ahead of {', '.join(beaten)} ({_p(worst, '<=')}, {seeds} seeds); {leader} vs "
            f"{', '.join(level)} not separated ({_p(close['p_bh'], '=' if len(level) == 1 else '>=')})"
            + _others_clause(s, leader, rest)
        )
    return out


def headline(
    experiment: str, group: dict, series: list[dict], recommendation: dict, overview: dict, opts, note: str = ""
) -> dict:
    """One short sentence per decision metric, the tasks without signal named once, and the overall winner (text);
    the verdict in one or two sentences, and what the decisions leave out (notes: the tasks without signal, runs
    left out), which the report shows around its decisions table. series: the decision series as tested
    (inference/families.py); note: a last sentence (the tokenizers')."""
    variants = group["variants"]
    excluded = overview["not_analyzed"]
    left_runs = f"{len(excluded)} run(s) unfinished or failed, left out: {', '.join(excluded)}" if excluded else ""
    diverged = overview.get("diverged")
    apart = f"{len(diverged)} diverged, listed apart: {', '.join(diverged)}" if diverged else ""
    tail = "".join(f" ({t})" for t in (left_runs, apart) if t)
    short = {
        t["task"]: metric_label({"task": t["task"], "metric": "", "primary": True}) for t in recommendation["rejected"]
    }
    primary = {(opts.primary or VAL_TASK).partition("/")[0], VAL_TASK}  # decided whatever its criteria
    no_signal = [
        short[r["task"]] for r in recommendation["rejected"] if r["status"] == "no_signal" and r["task"] not in primary
    ]
    unknown = [
        short[r["task"]] for r in recommendation["rejected"] if r["status"] != "no_signal" and r["task"] not in primary
    ]
    left_out = sorted({m["task"] for m in group.get("item_mismatch", []) if not m["kept"]})
    out = {"winner": None, "decisions": [], "no_signal": no_signal, "not_assessable": unknown, "left_out": left_out}
    note_text = f" {note}" if note else ""
    runs_notes = [t + "." for t in (left_runs, apart) if t] + ([note] if note else [])
    if len(variants) < 2:
        out["winner"] = variants[0] if variants else None
        out["text"] = f"{experiment}: {len(variants)} variant(s) finished, nothing to compare{tail}" + note_text
        out["verdict"] = f"Nothing to compare: {len(variants)} variant(s) finished."
        out["notes"] = runs_notes
        return out
    decisions = [d for s in series if (d := decide_series(s, opts))]
    out["decisions"] = decisions
    failed = failure_texts(group.get("failures", {}))
    out["failures"] = failed
    notes = [
        f"{v}: {text} (compared on the seeds finished on both sides; never named winner)" for v, text in failed.items()
    ]
    if no_signal:
        notes.append(f"{', '.join(no_signal)}: no signal here")
    if unknown:
        notes.append(f"{', '.join(unknown)}: signal not assessable with these runs")
    if left_out:
        notes.append(f"{', '.join(left_out)}: left out (runs scored different items)")
    out["winner"] = winner(decisions, set(failed))
    if out["winner"]:
        n = sum(d["status"] == "best" for d in decisions)
        verdict = f"Winner: {out['winner']} (best on {n} of {len(decisions)} decision metric(s), behind on none)"
    elif not decisions:
        verdict = "No decision metric to compare on"
    else:
        verdict = "No winner established"
    only_val = all(s["task"] == VAL_TASK for s in group["series"])
    scope = "validation loss only: no task evals in these runs" if only_val else ""
    if any(d["status"] in ("too_few_seeds", "no_difference") and d["seeds_needed"] for d in decisions):
        verdict += (
            f" (seeds needed: per variant, for {opts.power:.0%} power at the level each pair is tested at (its "
            f"family's alpha over its size), from the observed seed spread)"
        )
    averaged = (
        f"Each run's score: the mean of its last {opts.average_last} evaluations." if opts.average_last > 1 else ""
    )
    out["text"] = (
        f"{experiment}: "
        + "; ".join([d["text"] for d in decisions] + notes)
        + (f" ({scope})" if scope else "")
        + f". {verdict}.{tail}"
        + (f" {averaged}" if averaged else "")
        + note_text
    )
    out["verdict"] = short_verdict(decisions, out["winner"], failed, opts.min_seeds)
    scope_note = ["Validation loss only: no task evals in these runs."] if scope else []
    out["notes"] = [n + "." for n in notes] + scope_note + runs_notes + ([averaged] if averaged else [])
    return out


# ---------------------------------------------------------------------------------------------------------------
# an adaptive study (ablate run --until-decided): its decisions lead the headline

OPTIONAL_STOPPING_NOTE = (
    "fixed-n p-values, not valid under optional stopping: the seeds were added where a decision was open, so these "
    "tests looked at the data after every round; the adaptive study's anytime-valid decisions are the ones to read"
)
_STOPPED = {
    "decided": "stopped: every contrast decided or closed",
    "max_seeds": "stopped at max seeds",
    "budget": "stopped by the budget",
}


def _contrast_text(c: dict, with_metric: bool, futility: float | None = None) -> str:
    """'slow worse than baseline, decided at 3 seeds', 'baseline vs twin equivalent within 0.01 at 5 seeds', or
    'baseline vs twin open at 6 seeds (interval [-0.02, 0.03])'."""
    name = f"{c['metric']}: " if with_metric else ""
    if c["decision"] in ("a", "b"):
        better, worse = (c["a"], c["b"]) if c["decision"] == "a" else (c["b"], c["a"])
        return f"{name}{worse} worse than {better}, decided at {c['decided_at']} seeds"
    if c["decision"] == "equivalent":
        return f"{name}{c['a']} vs {c['b']} equivalent within {c['margin']:g} at {c['decided_at']} seeds"
    lo, hi = c["interval"] or (None, None)
    bounds = f" (interval [{lo:.3g}, {hi:.3g}])" if lo is not None and hi is not None else ""
    below = f" (estimated chance of a decision < {futility:g})" if futility else ""
    state = f"closed for futility{below}" if _state(c) == "futile" else "open"
    return f"{name}{c['a']} vs {c['b']} {state} at {c['seeds']} seeds{bounds}"


def _state(c: dict) -> str:
    """A contrast's decision, "futile" also where study.json files before 2026-11-27 said "undecidable"."""
    from ablate.report.sections.sequential.decide import CLOSED, FUTILE

    return FUTILE if c["decision"] in CLOSED else c["decision"]


def sequential_text(section: dict) -> str:
    """The adaptive study in words: each contrast, the compute against a fixed design, how it stopped, and a flag
    where the rule changed after results were seen."""
    contrasts = section["contrasts"]
    several = len({c["metric"] for c in contrasts}) > 1
    still_open = [c for c in contrasts if c["decision"] == "open"]
    parts = []
    futility = (section.get("rule") or {}).get("futility")
    below = f" (estimated chance of a decision < {futility:g})" if futility else ""
    for state, word in (("open", "open"), ("futile", f"closed for futility{below}")):
        left = [c for c in contrasts if _state(c) == state]
        if len(left) > 3:  # one clause for many open (or closed) contrasts (the table lists each)
            seeds = sorted({c["seeds"] for c in left})
            at = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
            parts.append(f"{len(left)} of {len(contrasts)} contrasts {word} at {at} seeds (see the table)")
    many = {state for state in ("open", "futile") if sum(_state(c) == state for c in contrasts) > 3}
    parts[:0] = [_contrast_text(c, several, futility) for c in contrasts if _state(c) not in many]
    compute = section["compute"]
    if compute["fixed_design_share"] is not None:
        parts.append(
            f"{compute['fixed_design_share']:.0%} of a fixed {compute['fixed_design_seeds']}-seed design's compute"
        )
    stopped = _STOPPED.get(section["stopped"], "not stopped yet (rounds still to come)")
    if still_open and section["stopped"] != "decided" and len(still_open) <= 3:
        stopped += f", {len(still_open)} contrast(s) open"
    design = {"group_sequential": "group-sequential"}.get(section.get("design", "anytime"), "anytime-valid")
    text = "; ".join(parts) + f" ({stopped}; {design}, alpha {section['alpha']:g} over the whole study)"
    if section["rule_changed_after_results"]:
        text += (
            ". FLAGGED: the decision rule changed after results were seen ("
            + "; ".join(section["rule_changes"])
            + "), so the study's error guarantee does not hold"
        )
    return text


def sequential_headline(headline: dict, section: dict, experiment: str) -> dict:
    """The headline with the adaptive study first: its decisions, then the fixed-n view, labelled."""
    fixed = headline["text"].removeprefix(f"{experiment}: ")
    said = sequential_text(section)
    return {
        **headline,
        "sequential": said,
        "rule_changed_after_results": section["rule_changed_after_results"],
        "verdict": f"Adaptive study: {said}.",
        "text": f"{experiment} (adaptive study): {said}. Fixed-n tests (p-values not valid under optional stopping): "
        f"{fixed}",
    }
