"""The report read in ten seconds: the verdict in one or two sentences (the winner and the pairs decided, or "no
winner" and why), then the decisions as a table, one row per decision metric (headline.py's decisions)."""

from __future__ import annotations

from ablate.report.schema import Decision, Headline, OpenPair
from ablate.report.text.fmt import fmt, seeds_needed

STATUS = {
    "best": "decided",
    "ahead": "partly decided",
    "no_difference": "open",
    "too_few_seeds": "too few seeds",
    "not_tested": "not tested",
    "tie": "tie at the top",
}


def _by_better(decided: list[list[str]]) -> dict[str, list[str]]:
    """[[better, worse], ...] -> {better: [worse, ...]}, in the order the pairs come."""
    out: dict[str, list[str]] = {}
    for better, worse in decided:
        out.setdefault(better, []).append(worse)
    return out


def _needed_words(pair: OpenPair) -> str:
    """'~8 seeds needed', 'more items needed, not more seeds', or 'seed spread unknown' for an open pair."""
    if pair.more_items:
        return "more items needed, not more seeds"
    found = seeds_needed(pair.seeds_needed, pair.seeds_needed_range, "more than ")
    return "seed spread unknown" if found is None else f"~{found[0]} seeds needed"


def _why_no_winner(decisions: list[Decision], failed: dict[str, str], min_seeds: int) -> str:
    tops = [d for d in decisions if d.status == "best"]
    if len({d.leader for d in tops}) > 1:
        return ", ".join(f"{d.leader} best on {d.name}" for d in tops)
    if tops:
        lead, on = tops[0].leader, ", ".join(d.name for d in tops)
        if lead in failed:
            return f"{lead} best on {on}, but {failed[lead]}: never named winner"
        behind = [d.name for d in decisions if lead in d.ahead_of]
        return f"{lead} best on {on}, but behind on {', '.join(behind)}"
    if all(d.status == "too_few_seeds" for d in decisions):
        seeds = min(d.seeds for d in decisions)
        return f"too few seeds to test a difference ({seeds} per variant, {min_seeds} needed)"
    if all(d.status == "tie" for d in decisions):
        return "every decision metric ties at the top"
    why = "no decision metric separates its leader from every other variant"
    closest = next((d for d in decisions if d.closest_open and d.closest_open.testable), None)
    if closest:
        c = closest.closest_open
        why += f" (closest open pair: {c.a} vs {c.b} on {closest.name}, {_needed_words(c)})"
    return why


def verdict(decisions: list[Decision], winner: str | None, failed: dict[str, str], min_seeds: int) -> str:
    """The winner and the pairs decided, or "No winner" and why, in one or two sentences."""
    if not decisions:
        return "No winner: no decision metric to compare on."
    decided = "; ".join(
        " and ".join(f"{better} ahead of {', '.join(worse)}" for better, worse in _by_better(d.decided).items())
        + f" on {d.name}"
        for d in decisions
        if d.decided
    )
    also = f" Decided: {decided}." if decided else ""
    if winner:
        on = ", ".join(d.name for d in decisions if d.status == "best")
        return f"Winner: {winner} (best on {on}, behind on none).{also}"
    return f"No winner: {_why_no_winner(decisions, failed, min_seeds)}.{also}"


def table(headline: Headline, power: float) -> tuple[str, list[str], list[list[str]]]:
    """The decisions table: metric, status, leader, pairs decided, the leader's closest open pair and the seeds
    it needs (the range an sd from few seeds leaves in brackets)."""
    rows = []
    for d in headline.decisions:
        pair, needed = d.closest_open, ""
        if pair is None:
            open_text = "none"
        elif not pair.testable:  # too few seeds: the seeds needed say how many; else the reason
            why = "" if pair.untested == "seeds" else f": {pair.note.removeprefix('not tested: ')}"
            open_text = f"{pair.a} vs {pair.b} (not tested{why})"
        else:
            p = pair.p_bh
            shown = "n/a" if p is None else "<0.001" if p < 0.001 else f"{p:.2g}"
            open_text = f"{pair.a} vs {pair.b} (p_BH {shown})"
        if pair is not None and pair.untested in (None, "seeds"):
            found = seeds_needed(pair.seeds_needed, pair.seeds_needed_range, ">", fmt)
            needed = "more items" if pair.more_items else "n/a" if found is None else found[0]
            if found and found[1] and not pair.more_items:
                needed += f" ({found[1][0]}-{found[1][1]})"
        decided = "; ".join(f"{b} > {', '.join(w)}" for b, w in _by_better(d.decided).items())
        leader = f"{d.leader} (tied)" if d.status == "tie" else d.leader
        rows.append([d.name, STATUS[d.status], leader, decided or "none", open_text, needed])
    caption = (
        f"Decisions, one row per decision metric (seeds needed: per variant, for {power:.0%} power at the level "
        "the pair is tested at; the range an sd from few seeds leaves in brackets)"
    )
    return caption, ["metric", "status", "leader", "pairs decided", "closest open pair", "seeds needed"], rows
