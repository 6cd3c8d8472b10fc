"""The decisions in words: one sentence per decision metric, and the headline (an adaptive study's decisions lead it:
adaptive.py).

A sentence claims only pairs that were tested (the leader against each other variant, and any other significant
pair); where a pair is open it says how many seeds would settle it (families.py's seeds needed).
"""

from __future__ import annotations

from dataclasses import dataclass

from ablate.report.inputs.runs import VAL_TASK, sign_of, task_label
from ablate.report.inputs.failures import failure_texts
from ablate.report.schema import Decision, Group, Headline, OpenPair, Overview, Pairwise, Recommendation, Series
from ablate.report.sections.decisions.families import metric_label, winner
from ablate.report.sections.decisions.pairs import best
from ablate.report.sections.decisions.verdict import verdict as short_verdict
from ablate.report.text.fmt import seeds_needed


def _gap(p: Pairwise, leader: str, sign: int) -> float:
    """How far `leader` is ahead in a pairwise row (oriented: > 0 ahead), from the pair's own estimate: the mean
    per-seed difference over the seeds both ran."""
    return sign * (p.diff if p.a == leader else -p.diff)


def _p(x, op: str = "=") -> str:
    """p_BH=0.003, p_BH<0.001, or with op "<=" a bound over several pairs."""
    return "p_BH n/a" if x is None else "p_BH<0.001" if x < 0.001 else f"p_BH{op}{x:.2g}"


def needed_text(row: Pairwise) -> str:
    """'~13 seeds needed (6 to 210 within the sd's uncertainty)' for a pair's seeds-needed estimate."""
    if row.more_items:
        return "more items, not more seeds: the item set's own noise hides a difference this size at any seed count"
    found = seeds_needed(row.seeds_needed, row.seeds_needed_range, "more than ")
    if found is None:
        return "seed spread unknown"
    need, span = found
    return f"~{need} seeds needed" + (f" ({span[0]} to {span[1]} within the sd's uncertainty)" if span else "")


def _others_clause(s: Series, leader: str, rest: list[str]) -> str:
    """What the tests say about the pairs that do not involve the leader: each significant one, or that none is."""
    found = [p for p in s.pairwise if leader not in (p.a, p.b) and p.significant and p.better in (p.a, p.b)]
    if found:
        return "; also " + ", ".join(
            f"{p.better} ahead of {p.b if p.better == p.a else p.a} ({_p(p.p_bh)})" for p in found
        )
    return f"; {', '.join(rest)} not separated" if len(rest) >= 2 else ""


def _open_pair(leader: str, other: str | None, vs: dict[str, Pairwise]) -> OpenPair | None:
    """The leader's pair with `other` as the decisions table shows it (None: every pair of the leader decided)."""
    if other is None:
        return None
    row = vs[other]
    keep = ("p_bh", "testable", "untested", "note", "seeds_needed", "seeds_needed_range", "more_items")
    return OpenPair(a=leader, b=other, **{k: getattr(row, k) for k in keep})


@dataclass(frozen=True)
class _Standing:
    """Where a series' variants stand against its leader. top: the leader read from the pairs (pairs.best), None on
    a tie at the top (the leader is then either); vs: the leader's pair with each other variant; order: the leader,
    then the others by their paired gap to it (the closest first); beaten: those significantly behind it, level: the
    rest; seeds: the fewest any variant ran."""

    top: str | None
    leader: str
    rest: list[str]
    vs: dict[str, Pairwise]
    order: list[str]
    beaten: list[str]
    level: list[str]
    seeds: int

    @property
    def runner(self) -> str:
        """The runner-up: the closest pair, by its paired estimate."""
        return self.order[1]

    @property
    def close(self) -> Pairwise:
        return self.vs[self.runner]


def _standing(s: Series) -> _Standing:
    sign = sign_of(s.direction)
    variants = list(s.final)
    top = best(s)
    leader = top or sorted(variants, key=lambda v: -sign * s.final[v].mean)[0]  # a tie: either is named
    rest = [v for v in variants if v != leader]  # in the variants' own (natural) order, which a reader can scan
    vs = {o: next(p for p in s.pairwise if {p.a, p.b} == {leader, o}) for o in rest}
    order = [leader] + sorted(rest, key=lambda o: _gap(vs[o], leader, sign))  # stable: ties keep natural order
    beaten = [o for o in rest if vs[o].significant and vs[o].better == leader]
    level = [o for o in rest if o not in beaten]
    seeds = min(len(s.final[v].seeds) for v in variants)
    return _Standing(top, leader, rest, vs, order, beaten, level, seeds)


def _sentence(s: Series, name: str, st: _Standing) -> tuple[str, str]:
    """(status, the sentence): a tie at the top, a lead not tested, best (ahead of every other variant), no
    significant difference, or ahead of some; the sentence claims only pairs that were tested."""
    leader, rest, close, seeds = st.leader, st.rest, st.close, st.seeds
    if st.top is None:
        return "tie", f"{name}: tie at the top ({leader}, {st.runner})"
    if not close.testable:
        status = "too_few_seeds" if close.untested == "seeds" else "not_tested"
        why = needed_text(close) if close.untested == "seeds" else close.note.removeprefix("not tested: ")
        return status, f"{name}: {leader} ahead, not established with {seeds} seed{'s' * (seeds != 1)} ({why})"
    if not st.level:
        worst = max(st.vs[o].p_bh for o in st.order[1:])
        return "best", (
            f"{name}: {leader} best{', ahead of ' + ', '.join(rest) if len(rest) > 1 else ''} "
            f"({_p(worst, '=' if len(rest) == 1 else '<=')}, {seeds} seeds)" + _others_clause(s, leader, rest)
        )
    if not st.beaten:
        need = close.seeds_needed
        how = f"; {needed_text(close)}" if need is not None and need > seeds else ""
        return "no_difference", (
            f"{name}: no significant difference ({leader} vs {st.runner} {_p(close.p_bh)}, {seeds} seeds{how})"
        )
    worst = max(st.vs[o].p_bh for o in st.beaten)
    return "ahead", (
        f"{name}: {leader} ahead of {', '.join(st.beaten)} ({_p(worst, '<=')}, {seeds} seeds); {leader} vs "
        f"{', '.join(st.level)} not separated ({_p(close.p_bh, '=' if len(st.level) == 1 else '>=')})"
        + _others_clause(s, leader, rest)
    )


def decide_series(s: Series, opts) -> Decision | None:
    """The decision on one metric: leader, the variants it is significantly ahead of, and one sentence that claims
    only pairs that were tested (the leader against each other variant, and any other significant pair)."""
    if len(s.final) < 2:
        return None
    st = _standing(s)
    name = metric_label(s)
    status, text = _sentence(s, name, st)
    return Decision(
        task=s.task,
        metric=s.metric,
        name=name,
        direction=s.direction,
        leader=st.leader,
        ahead_of=st.beaten,
        not_separated_from=st.level,
        seeds=st.seeds,
        seeds_needed=st.close.seeds_needed,
        seeds_needed_range=st.close.seeds_needed_range,
        p_bh={o: st.vs[o].p_bh for o in st.order[1:]},
        # the significant pairs [better, worse], and the leader's closest pair not decided: the decisions table
        decided=[[p.better, p.b if p.better == p.a else p.a] for p in s.pairwise if p.significant],
        closest_open=_open_pair(st.leader, next((o for o in st.order[1:] if o in st.level), None), st.vs),
        status=status,
        text=text,
    )


def _runs_left_out(overview: Overview) -> list[str]:
    """The runs the decisions leave out, in words: unfinished or failed ones, diverged ones (each only if any)."""
    excluded, diverged = overview.not_analyzed, overview.diverged
    left_runs = f"{len(excluded)} run(s) unfinished or failed, left out: {', '.join(excluded)}" if excluded else ""
    apart = f"{len(diverged)} diverged, listed apart: {', '.join(diverged)}" if diverged else ""
    return [t for t in (left_runs, apart) if t]


def _without_signal(recommendation: Recommendation, opts) -> tuple[list[str], list[str]]:
    """(the tasks with no signal here, those whose signal these runs cannot assess), by their short names; the
    primary metric's task is decided whatever its criteria, so never named."""
    short = {t.task: task_label(t.task) for t in recommendation.rejected}
    primary = {(opts.primary or VAL_TASK).partition("/")[0], VAL_TASK}
    rejected = [r for r in recommendation.rejected if r.task not in primary]
    no_signal = [short[r.task] for r in rejected if r.status == "no_signal"]
    return no_signal, [short[r.task] for r in rejected if r.status != "no_signal"]


def _overall(decisions: list[Decision], top: str | None, opts) -> str:
    """The overall verdict at the end of the headline's text: the winner, or why there is none."""
    if top:
        n = sum(d.status == "best" for d in decisions)
        verdict = f"Winner: {top} (best on {n} of {len(decisions)} decision metric(s), behind on none)"
    elif not decisions:
        verdict = "No decision metric to compare on"
    else:
        verdict = "No winner established"
    if any(d.status in ("too_few_seeds", "no_difference") and d.seeds_needed for d in decisions):
        verdict += (
            f" (seeds needed: per variant, for {opts.power:.0%} power at the level each pair is tested at (its "
            f"family's alpha over its size), from the observed seed spread)"
        )
    return verdict


def _left_aside(failed: dict[str, str], no_signal: list[str], unknown: list[str], left_out: list[str]) -> list[str]:
    """What the decisions set aside, each said once: variants with failed seeds, tasks without signal or whose
    signal cannot be assessed, tasks whose runs scored different items."""
    notes = [
        f"{v}: {text} (compared on the seeds finished on both sides; never named winner)" for v, text in failed.items()
    ]
    notes += [f"{', '.join(no_signal)}: no signal here"] if no_signal else []
    notes += [f"{', '.join(unknown)}: signal not assessable with these runs"] if unknown else []
    return notes + ([f"{', '.join(left_out)}: left out (runs scored different items)"] if left_out else [])


def headline(
    experiment: str,
    group: Group,
    series: list[Series],
    recommendation: Recommendation,
    overview: Overview,
    opts,
    note: str = "",
) -> Headline:
    """One short sentence per decision metric, the tasks without signal named once, and the overall winner (text);
    the verdict in one or two sentences, and what the decisions leave out (notes: the tasks without signal, runs
    left out), which the report shows around its decisions table. series: the decision series as tested
    (families.py); note: a last sentence (the tokenizers')."""
    variants, runs_left = group.variants, _runs_left_out(overview)
    tail = "".join(f" ({t})" for t in runs_left)
    no_signal, unknown = _without_signal(recommendation, opts)
    left_out = sorted({m.task for m in group.item_mismatch if not m.kept})
    told = {"no_signal": no_signal, "not_assessable": unknown, "left_out": left_out}  # whatever the decisions
    note_text = f" {note}" if note else ""
    runs_notes = [t + "." for t in runs_left] + ([note] if note else [])
    if len(variants) < 2:
        return Headline(
            winner=variants[0] if variants else None,
            decisions=[],
            **told,
            text=f"{experiment}: {len(variants)} variant(s) finished, nothing to compare{tail}" + note_text,
            verdict=f"Nothing to compare: {len(variants)} variant(s) finished.",
            notes=runs_notes,
        )
    decisions = [d for s in series if (d := decide_series(s, opts))]
    failed = failure_texts(group.failures)
    notes = _left_aside(failed, no_signal, unknown, left_out)
    top = winner(decisions, set(failed))
    only_val = all(s.task == VAL_TASK for s in group.series)
    scope = "validation loss only: no task evals in these runs" if only_val else ""
    averaged = (
        f"Each run's score: the mean of its last {opts.average_last} evaluations." if opts.average_last > 1 else ""
    )
    text = (
        f"{experiment}: "
        + "; ".join([d.text for d in decisions] + notes)
        + (f" ({scope})" if scope else "")
        + f". {_overall(decisions, top, opts)}.{tail}"
        + (f" {averaged}" if averaged else "")
        + note_text
    )
    scope_note = ["Validation loss only: no task evals in these runs."] if scope else []
    return Headline(
        winner=top,
        decisions=decisions,
        **told,
        failures=failed,
        text=text,
        verdict=short_verdict(decisions, top, failed, opts.min_seeds),
        notes=[n + "." for n in notes] + scope_note + runs_notes + ([averaged] if averaged else []),
    )
