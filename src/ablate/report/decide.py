"""Decisions: which variant is better, on what evidence, said in one sentence per decision metric.

- Decision metrics: the primary metric (validation loss, or bits per byte across tokenizers, or `--primary`) and,
  per task, the best measured metric that passes the criteria (choose.py). A task where no metric does is "no
  signal here": never a win or a loss.
- Inference is at the level of replication, the training seed: a pair is tested over run-level scores (a paired t
  over the per-seed differences of the seeds both variants ran, Welch over the two samples when they share fewer
  than 2) under one noise model (stats.seed_test): the seed variance divided by the seeds plus the persistent
  item-set variance, not divided by them, on Satterthwaite's degrees of freedom; a difference repeated exactly by
  every seed is evidence only as far as the items it rests on are. The CI adds item noise with a two-level
  bootstrap (seeds, then items); the item-level p is shown as evaluation noise only.
- Fewer than `min_seeds` seeds per variant, or compared points more than `max_token_gap` apart in tokens, or a
  token count missing (match.token_gap): not tested, and the report says why.
- Error control over the whole study, in two families (a fallback procedure): the primary metric's pairs are
  declared before any result and tested as their own question, Benjamini-Hochberg at alpha x primary_share (0.04);
  every pair x candidate task metric (every metric the choice could have picked: choosing a metric, and its gates,
  select on the runs' own outcome) is the second family, Benjamini-Hochberg at the rest of alpha (0.01), or at the
  whole alpha when the primary family tested at least one pair and rejected every pair it tested (its alpha is then
  unspent: carried forward; a primary family that tested nothing carries nothing).
  In an A/A study the chance of any claim is at most alpha1 + alpha2 = alpha; within each family BH bounds the
  false discovery rate at its level.
- Seeds needed are computed for the level a pair is actually tested at: its family's alpha over the family's size
  (Benjamini-Hochberg's first step, where a lone real effect must pass), with the range that an sd estimated from
  k seeds leaves (80% chi-square interval).

`compare`, `pairwise`, `apply_family`, `decide_series` and `winner` are what the report runs; the calibration
(report/calibrate.py) runs the same functions on simulated studies.
"""

from __future__ import annotations

import numpy as np

from ablate.report import match, stats
from ablate.report.runs import VAL_TASK


def _gap(p: dict, leader: str, sign: int) -> float:
    """How far `leader` is ahead in a pairwise row (oriented: > 0 ahead), from the pair's own estimate: the mean
    per-seed difference over the seeds both ran."""
    return sign * (p["diff"] if p["a"] == leader else -p["diff"])


def best(s: dict) -> str | None:
    """A series' leader, from the paired estimates on shared seeds (each pairwise row's `better`), never from the
    variants' own means: with unequal seed sets (an adaptive study stops giving seeds to decided variants) a mean
    over other seeds can put first a variant that every paired comparison puts behind. The variant ahead of every
    other; where the estimates cycle, the one ahead of most; in both cases among the variants no significant pair
    puts behind (once the families are applied), the means breaking what is left. None when several stay tied."""
    sign = 1 if s["direction"] == "higher" else -1
    variants, rows = list(s["final"]), s["pairwise"]
    behind = {p["b"] if p["better"] == p["a"] else p["a"] for p in rows if p["significant"] and p["better"]}
    candidates = [v for v in variants if v not in behind] or variants
    wins = {v: sum(p["better"] == v for p in rows) for v in candidates}
    leaders = [v for v in candidates if wins[v] == max(wins.values())]
    top = max(sign * s["final"][v]["mean"] for v in leaders)
    leaders = [v for v in leaders if sign * s["final"][v]["mean"] == top]
    return leaders[0] if len(leaders) == 1 else None


def _rows(matrix: np.ndarray | None, seeds: dict, keep: list[int]) -> np.ndarray | None:
    """The rows of a (seeds, items) matrix (rows in sorted seed order) for the seeds `keep`."""
    return None if matrix is None else matrix[[sorted(seeds).index(s) for s in keep]]


def compare(
    a: dict[int, float],
    b: dict[int, float],
    sign: int,
    opts,
    items_a: np.ndarray | None = None,
    items_b: np.ndarray | None = None,
    stderr_a: dict | None = None,
    stderr_b: dict | None = None,
    tokens: tuple[list, list] | None = None,
) -> dict:
    """One pair: a and b map seed -> run-level score; items_a/items_b are (seeds, items) matrices, rows in sorted
    seed order, columns the same items (None without per-item files); stderr_*: seed -> logged standard error;
    tokens: the two variants' compared token counts (run order irrelevant)."""
    with_items = items_a is not None and items_b is not None and items_a.shape[1] == items_b.shape[1]
    ia, ib = (items_a, items_b) if with_items else (None, None)
    t = stats.seed_test(a, b, ia, ib, stderr_a, stderr_b)
    diff = t["diff"]
    shared = sorted(set(a) & set(b))
    n_tested = t["n_shared"] if t["paired"] else min(t["n_a"], t["n_b"])
    gap, refused = match.token_gap(tokens[0] + tokens[1], opts.max_token_gap) if tokens else (None, None)
    testable = n_tested >= opts.min_seeds and t["p"] is not None and not refused
    row = {
        "diff": diff,
        "better": None,
        "test": t["test"],
        "paired": t["paired"],
        "p_seeds": t["p"],
        "n_seeds": t["n_shared"] if t["paired"] else None,
        "n_seeds_a": t["n_a"],
        "n_seeds_b": t["n_b"],
        "sd_diff": t["sd_diff"],
        "sd_seeds": t["sd_seeds"],
        "noise_floor_sd": t["noise_floor_sd"],
        "item_sd": t["item_sd"],
        "item_df": t["item_df"],
        "noise_source": t["noise_source"],
        "noise_assumption": stats.STDERR_ASSUMPTION if t["noise_source"] == "logged standard errors" else None,
        "df": t["df"],
        "seeds_agree": None,
        "testable": testable,
        "token_gap": gap,
        "untested": None,  # why a pair was not tested: "tokens", "seeds" or "no_spread"
        "seeds_needed": None,
        "seeds_needed_range": None,
        "more_items": None,  # the item set alone hides a difference this size: more items, not more seeds
        "ci": None,
        "p_items": None,
        "n_items": None,
        "family": None,
        "p_bh": None,
        "significant": None,
        "note": "",
    }
    if sign * diff > 0 or sign * diff < 0:
        row["better"] = "a" if sign * diff > 0 else "b"
    if t["paired"] and diff != 0:
        per_seed = np.array([a[s] - b[s] for s in shared])
        row["seeds_agree"] = int(np.sum(np.sign(per_seed) == np.sign(diff)))
    if with_items:
        row["n_items"] = int(items_a.shape[1])
        pa, pb = (_rows(items_a, a, shared), _rows(items_b, b, shared)) if t["paired"] else (items_a, items_b)
        row["p_items"] = stats.item_pvalue(pa, pb)
        if opts.bootstrap > 0:
            row["ci"] = stats.bootstrap_diff(pa, pb, t["paired"], opts.bootstrap, opts.seed)
    if refused:
        row["untested"] = "tokens"
        row["note"] = f"not tested: {refused}"
    elif n_tested < opts.min_seeds:
        row["untested"] = "seeds"
        what = f"{n_tested} seeds both ran" if t["paired"] else f"{n_tested} seeds on the smaller side"
        row["note"] = f"not tested: {what}, fewer than {opts.min_seeds}"
    elif t["p"] is None:
        row["untested"] = "no_spread"
        row["note"] = "not tested: no seed spread and no item noise known to bound it"
    if t["paired"] and (len(shared) < len(a) or len(shared) < len(b)):
        row["note"] = (row["note"] + "; " if row["note"] else "") + (
            f"paired over the {len(shared)} seeds both ran ({len(a)} vs {len(b)})"
        )
    return row


def pairwise(
    variants: list[str],
    scores: dict[str, dict[int, float]],
    items: dict[str, np.ndarray] | None,
    sign: int,
    opts,
    stderrs: dict[str, dict] | None = None,
    final: dict | None = None,
) -> list[dict]:
    """Every pair (a before b in `variants` order), each a `compare` row with a and b named. final: the series'
    final dict (its compared token counts refuse pairs too far apart)."""
    rows = []
    for i, a in enumerate(variants):
        for b in variants[i + 1 :]:
            row = compare(
                scores[a],
                scores[b],
                sign,
                opts,
                items[a] if items else None,
                items[b] if items else None,
                stderrs.get(a) if stderrs else None,
                stderrs.get(b) if stderrs else None,
                (final[a]["tokens"], final[b]["tokens"]) if final else None,
            )
            row["better"] = {"a": a, "b": b}.get(row["better"])
            rows.append({"a": a, "b": b, **row})
    return rows


def is_primary(s: dict, opts) -> bool:
    """The study's primary metric: `opts.primary` ("task" for its primary metric, or "task/metric"), else
    validation loss (its bits per byte when the runs' tokenizers differ: the val task then holds only that)."""
    want = getattr(opts, "primary", None) or VAL_TASK
    task, _, metric = want.partition("/")
    if s["task"] != task:
        return False
    return s["metric"] == metric if metric else (s["primary"] or s["task"] == VAL_TASK)


def _bh(rows: list[dict], alpha: float, name: str, power: float) -> dict:
    """Benjamini-Hochberg at `alpha` over the testable rows (in place: family, p_bh, significant, seeds needed)."""
    tested = [p for p in rows if p["testable"]]
    for p, adjusted in zip(tested, stats.bh_adjust([p["p_seeds"] for p in tested])):
        p["p_bh"], p["significant"] = adjusted, bool(adjusted < alpha)
    step = alpha / max(1, len(rows))  # where a lone real effect must pass once every pair is tested
    for p in rows:
        p["family"] = name
        if p["significant"]:
            continue  # established: no seeds needed
        items = ((p["item_sd"] or 0.0) ** 2, p["item_df"])  # the persistent item term: no seed count removes it
        need = stats.seeds_needed(p["diff"], p["sd_diff"], step, power, p["paired"], *items)
        have = p["n_seeds"] if p["paired"] else min(p["n_seeds_a"], p["n_seeds_b"])
        if need is not None and p["untested"] == "seeds":  # too few to be tested: at least one more
            need = max(need, have + 1)
        p["seeds_needed"] = need
        p["more_items"] = stats.items_limit(p["diff"], step, power, *items)
        seed_df = p["n_seeds"] - 1 if p["paired"] else p["n_seeds_a"] + p["n_seeds_b"] - 2
        interval = stats.sd_interval(p["sd_seeds"], seed_df) if p["sd_seeds"] is not None and seed_df else None
        if need is not None and interval is not None and not p["more_items"]:
            # the fresh floor stays: a true seed sd below it still leaves each evaluation's answer noise
            sds = [max(x, p["noise_floor_sd"] or 0.0) for x in interval]
            p["seeds_needed_range"] = [
                stats.seeds_needed(p["diff"], sd, step, power, p["paired"], *items) for sd in sds
            ]
    return {
        "name": name,
        "alpha": alpha,
        "comparisons": len(rows),
        "tests": len(tested),
        "rejected": sum(bool(p["significant"]) for p in tested),
        "first_step_alpha": step,
    }


def apply_family(series: list[dict], opts, where: str, decisions: list[dict] | None = None) -> dict:
    """The study's error control over the given series (in place on their pairwise rows: family, p_bh,
    significant, seeds_needed): the primary metric's pairs first at alpha x primary_share, then every other
    series' pairs at the rest of alpha, or at all of it when the primary family tested pairs and rejected each.
    Rows that cannot be tested keep significant None. decisions: the series decisions are read on (default: all)."""
    decisions = series if decisions is None else decisions
    primary = [s for s in series if is_primary(s, opts)]
    others = [s for s in series if not is_primary(s, opts)]
    alpha1 = opts.alpha * opts.primary_share
    first = _bh([p for s in primary for p in s["pairwise"]], alpha1, "primary", opts.power)
    # alpha1 is unspent only where the primary family tested something and rejected all of it (nothing left that
    # could be a false claim); a family that tested nothing has spent no evidence and carries nothing forward
    carried = first["tests"] > 0 and first["rejected"] == first["tests"]
    alpha2 = opts.alpha if carried else opts.alpha - alpha1
    second = _bh([p for s in others for p in s["pairwise"]], alpha2, "tasks", opts.power)
    first["metrics"] = [[s["task"], s["metric"]] for s in primary]
    second["metrics"] = [[s["task"], s["metric"]] for s in others]
    second["carried_forward"] = carried and alpha2 > opts.alpha - alpha1
    pairs = max((len(s["pairwise"]) for s in series), default=0)
    names = ", ".join(metric_label(s) for s in decisions)
    prim = ", ".join(metric_label(s) for s in primary) or "none"
    carried_text = " (the primary family rejected every pair it tested: its alpha carried forward)"
    text = f"{where}: primary metric {prim}, {first['comparisons']} pair(s), Benjamini-Hochberg at {alpha1:g}"
    if others:
        text += (
            f"; task metrics (every candidate but the baselines and answer-blind diagnostics; decisions on {names}), "
            f"{pairs} pair(s) x {len(others)} metric(s) = {second['comparisons']} comparisons, Benjamini-Hochberg "
            f"at {alpha2:g}" + (carried_text if second["carried_forward"] else "")
        )
    text += (
        f"; {first['tests'] + second['tests']} of {first['comparisons'] + second['comparisons']} comparisons tested "
        f"(>= {opts.min_seeds} seeds both variants ran); A/A any-claim rate <= {opts.alpha:g}"
    )
    if not first["comparisons"] + second["comparisons"]:
        text = f"no comparison {where}: fewer than 2 variants or no decision metric"
    return {
        "method": "fallback over two families, Benjamini-Hochberg within each",
        "alpha": opts.alpha,
        "level": "training seed",
        "min_seeds": opts.min_seeds,
        "power": opts.power,
        "family": text,
        "families": [first, second],
        "tests": first["tests"] + second["tests"],
        "comparisons": first["comparisons"] + second["comparisons"],
        "metrics": [[s["task"], s["metric"]] for s in decisions],
        "family_metrics": [[s["task"], s["metric"]] for s in series],
    }


def metric_label(s: dict) -> str:
    """A decision metric's short name: the task without ":cf", plus the metric when it is not the primary."""
    name = s["task"][:-3] if s["task"].endswith(":cf") else s["task"]
    if s["task"] == VAL_TASK:
        return "val_bpb" if s["metric"] == "bpb" else name
    return name if s["primary"] else f"{name} [{s['metric']}]"


def _p(x, op: str = "=") -> str:
    """p_BH=0.003, p_BH<0.001, or with op "<=" a bound over several pairs."""
    return "p_BH n/a" if x is None else "p_BH<0.001" if x < 0.001 else f"p_BH{op}{x:.2g}"


def needed_text(row: dict) -> str:
    """'~13 seeds needed (6 to 210 within the sd's uncertainty)' for a pair's seeds-needed estimate."""
    need, span = row["seeds_needed"], row.get("seeds_needed_range")

    def n(x):
        return f"more than {stats.MAX_SEEDS}" if x is not None and x > stats.MAX_SEEDS else str(x)

    if row.get("more_items"):
        return "more items, not more seeds: the item set's own noise hides a difference this size at any seed count"
    if need is None:
        return "seed spread unknown"
    text = f"~{n(need)} seeds needed"
    if span and None not in span and span[0] != span[1]:
        text += f" ({n(span[0])} to {n(span[1])} within the sd's uncertainty)"
    return text


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


def decide_series(s: dict, opts) -> dict | None:
    """The decision on one metric: leader, the variants it is significantly ahead of, and one sentence that claims
    only pairs that were tested (the leader against each other variant, and any other significant pair)."""
    sign = 1 if s["direction"] == "higher" else -1
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


def winner(decisions: list[dict], never: set[str] | frozenset = frozenset()) -> str | None:
    """The variant significantly best on some decision metric and significantly behind on none; None when no
    variant is, or when two are best on different metrics. `never`: variants with a failed or diverged seed,
    which cannot win on their surviving seeds."""
    tops = {d["leader"] for d in decisions if d["status"] == "best"}
    behind = {v for d in decisions if d["status"] in ("best", "ahead") for v in d["ahead_of"]}
    candidates = tops - behind - set(never)
    return next(iter(candidates)) if len(candidates) == 1 and len(tops) == 1 else None


def decision_series(group: dict, recommendation: dict, opts=None) -> list[dict]:
    """The primary metric (validation loss unless opts.primary names a task's), then each suite task's recommended
    metric: the only series decisions rest on."""
    keys = [(VAL_TASK, "loss"), (VAL_TASK, "bpb")]  # the val task holds one: bpb when tokenizers differ
    primary = [s for s in group["series"] if opts is not None and opts.primary and is_primary(s, opts)]
    keys = [(s["task"], s["metric"]) for s in primary] + keys
    taken = {s["task"] for s in primary}
    keys += [(e["task"], e["metric"]) for e in recommendation["suite"] if e["task"] not in taken | {VAL_TASK}]
    by_key = {(s["task"], s["metric"]): s for s in group["series"]}
    return [by_key[k] for k in dict.fromkeys(keys) if k in by_key]


def family_series(group: dict, decisions: list[dict]) -> list[dict]:
    """The decision series, then every other candidate metric of the group (not the choices-only baselines nor the
    answer-blind diagnostics): the families, so that choosing among them cannot add a claim."""
    return decisions + [
        s
        for s in group["series"]
        if not s["baseline"] and not s.get("diagnostic") and not any(s is d for d in decisions)
    ]


FAILED_STATES = ("diverged", "failed")  # a variant with a seed in one of these never wins on its survivors


def failed_seeds(runs_by_variant: dict) -> dict:
    """Variants with a failed or diverged seed: {variant: {"seeds": n, "by_state": {state: [seed, ...]}}} (runs:
    anything with .seed and .status). The fixed report and the adaptive study read failures through this."""
    out = {}
    for variant, runs in runs_by_variant.items():
        by_state = {state: sorted(r.seed for r in runs if r.status == state) for state in FAILED_STATES}
        if any(by_state.values()):
            out[variant] = {"seeds": len(runs), "by_state": by_state}
    return out


def failure_texts(failed: dict) -> dict[str, str]:
    """failed_seeds' dict -> variant -> 'k of n seeds diverged' (or failed)."""
    out = {}
    for variant, f in failed.items():
        parts = [f"{len(seeds)} of {f['seeds']} seeds {state}" for state, seeds in f["by_state"].items() if seeds]
        if parts:
            out[variant] = ", ".join(parts)
    return out


def headline(experiment: str, group: dict, recommendation: dict, overview: dict, opts) -> dict:
    """One short sentence per decision metric, the tasks without signal named once, and the overall winner."""
    variants = group["variants"]
    excluded = overview["not_analyzed"]
    tail = f" ({len(excluded)} run(s) unfinished or failed, left out: {', '.join(excluded)})" if excluded else ""
    if overview.get("diverged"):
        tail += f" ({len(overview['diverged'])} diverged, listed apart: {', '.join(overview['diverged'])})"
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
    if len(variants) < 2:
        out["winner"] = variants[0] if variants else None
        out["text"] = f"{experiment}: {len(variants)} variant(s) finished, nothing to compare{tail}"
        return out
    decisions = [d for s in decision_series(group, recommendation, opts) if (d := decide_series(s, opts))]
    out["decisions"] = decisions
    parts = [d["text"] for d in decisions]
    failed = failure_texts(group.get("failures", {}))
    out["failures"] = failed
    parts += [
        f"{v}: {text} (compared on the seeds finished on both sides; never named winner)" for v, text in failed.items()
    ]
    if no_signal:
        parts.append(f"{', '.join(no_signal)}: no signal here")
    if unknown:
        parts.append(f"{', '.join(unknown)}: signal not assessable with these runs")
    if left_out:
        parts.append(f"{', '.join(left_out)}: left out (runs scored different items)")
    out["winner"] = winner(decisions, set(failed))
    if out["winner"]:
        n = sum(d["status"] == "best" for d in decisions)
        verdict = f"Winner: {out['winner']} (best on {n} of {len(decisions)} decision metric(s), behind on none)"
    elif not decisions:
        verdict = "No decision metric to compare on"
    else:
        verdict = "No winner established"
    only_val = all(s["task"] == VAL_TASK for s in group["series"])
    scope = " (validation loss only: no task evals in these runs)" if only_val else ""
    if any(d["status"] in ("too_few_seeds", "no_difference") and d["seeds_needed"] for d in decisions):
        verdict += (
            f" (seeds needed: per variant, for {opts.power:.0%} power at the level each pair is tested at (its "
            f"family's alpha over its size), from the observed seed spread)"
        )
    averaged = (
        f" Each run's score: the mean of its last {opts.average_last} evaluations." if opts.average_last > 1 else ""
    )
    out["text"] = f"{experiment}: " + "; ".join(parts) + f"{scope}. {verdict}.{tail}{averaged}"
    return out


# ---------------------------------------------------------------------------------------------------------------
# an adaptive study (ablate run --until-decided): its decisions lead the headline

OPTIONAL_STOPPING_NOTE = (
    "fixed-n p-values, not valid under optional stopping: the seeds were added where a decision was open, so these "
    "tests looked at the data after every round; the adaptive study's anytime-valid decisions are the ones to read"
)
_STOPPED = {
    "decided": "stopped: every contrast decided",
    "max_seeds": "stopped at max seeds",
    "budget": "stopped by the budget",
}


def _contrast_text(c: dict, with_metric: bool) -> str:
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
    return f"{name}{c['a']} vs {c['b']} open at {c['seeds']} seeds{bounds}"


def sequential_text(section: dict) -> str:
    """The adaptive study in words: each contrast, the compute against a fixed design, how it stopped, and a flag
    where the rule changed after results were seen."""
    contrasts = section["contrasts"]
    several = len({c["metric"] for c in contrasts}) > 1
    still_open = [c for c in contrasts if c["decision"] == "open"]
    named = contrasts if len(still_open) <= 3 else [c for c in contrasts if c["decision"] != "open"]
    parts = [_contrast_text(c, several) for c in named]
    if len(still_open) > 3:  # one clause for many open contrasts (the table lists each)
        seeds = sorted({c["seeds"] for c in still_open})
        at = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
        parts.append(f"{len(still_open)} of {len(contrasts)} contrasts open at {at} seeds (see the table)")
    compute = section["compute"]
    if compute["fixed_design_share"] is not None:
        parts.append(
            f"{compute['fixed_design_share']:.0%} of a fixed {compute['fixed_design_seeds']}-seed design's compute"
        )
    stopped = _STOPPED.get(section["stopped"], "not stopped yet (rounds still to come)")
    if still_open and section["stopped"] != "decided" and len(still_open) <= 3:
        stopped += f", {len(still_open)} contrast(s) open"
    text = "; ".join(parts) + f" ({stopped}; anytime-valid, alpha {section['alpha']:g} over the whole study)"
    if section["rule_changed_after_results"]:
        text += (
            ". FLAGGED: the decision rule changed after results were seen ("
            + "; ".join(section["rule_changes"])
            + "), so the study's error guarantee does not hold"
        )
    return text


def sequential_headline(headline: dict, section: dict, experiment: str) -> None:
    """Puts the adaptive study first in the headline (in place): its decisions, then the fixed-n view, labelled."""
    fixed = headline["text"].removeprefix(f"{experiment}: ")
    headline["sequential"] = sequential_text(section)
    headline["rule_changed_after_results"] = section["rule_changed_after_results"]
    headline["text"] = (
        f"{experiment} (adaptive study): {headline['sequential']}. Fixed-n tests (p-values not valid under "
        f"optional stopping): {fixed}"
    )
