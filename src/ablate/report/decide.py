"""Decisions: which variant is better, on what evidence, said in one sentence per decision metric.

- Decision metrics: validation loss and, per task, the best measured metric that passes the criteria (choose.py).
  A task where no metric does is "no signal here": never a win or a loss.
- Inference is at the level of replication, the training seed: a pair is tested over run-level scores (paired t
  over per-seed differences when both variants ran the same seeds, Welch otherwise). The CI adds item noise with a
  two-level bootstrap (seeds, then items); the item-level p is shown as evaluation noise only.
- Fewer than `min_seeds` seeds per variant: not tested; the report gives the seeds a test would need.
- Every tested pair of every candidate metric at the largest scale (validation loss and every task metric but the
  choices-only baselines) forms one family; Benjamini-Hochberg adjusts its p-values and "significant" means
  adjusted p < alpha. Decisions are read on the chosen metrics only, but the family holds every metric the choice
  could have picked: choosing a metric, and its gates, select on the runs' own outcome (a ranking consistent over
  checkpoints goes with variants further apart), so adjusting over the chosen ones alone made more A/A claims than
  alpha (tests/test_report_calibration.py); over every candidate the choice cannot add a claim.

`compare`, `pairwise`, `apply_family`, `decide_series` and `winner` are what the report runs; the calibration
tests run the same functions on simulated studies.
"""

from __future__ import annotations

import numpy as np

from ablate.report import stats
from ablate.report.runs import VAL_TASK


def best(final: dict, sign: int) -> str | None:
    """The variant with the best mean final score; None when several share it (a tie names no winner)."""
    top = max(sign * f["mean"] for f in final.values())
    leaders = [v for v, f in final.items() if sign * f["mean"] == top]
    return leaders[0] if len(leaders) == 1 else None


def compare(
    a: dict[int, float],
    b: dict[int, float],
    sign: int,
    opts,
    items_a: np.ndarray | None = None,
    items_b: np.ndarray | None = None,
) -> dict:
    """One pair: a and b map seed -> run-level score; items_a/items_b are (seeds, items) matrices, rows in sorted
    seed order, columns the same items (None without per-item files)."""
    t = stats.seed_test(a, b)
    diff = t["diff"]
    testable = min(t["n_a"], t["n_b"]) >= opts.min_seeds and t["p"] is not None
    needed = stats.seeds_needed(diff, t["sd_diff"], opts.alpha, opts.power, t["paired"])
    row = {
        "diff": diff,
        "better": None,
        "test": t["test"],
        "paired": t["paired"],
        "p_seeds": t["p"],
        "n_seeds": t["n_a"] if t["paired"] else None,
        "n_seeds_a": t["n_a"],
        "n_seeds_b": t["n_b"],
        "sd_diff": t["sd_diff"],
        "seeds_agree": None,
        "testable": testable,
        "seeds_needed": None if needed is None else max(needed, opts.min_seeds),
        "ci": None,
        "p_items": None,
        "n_items": None,
        "p_bh": None,
        "significant": None,
        "note": "",
    }
    if sign * diff > 0 or sign * diff < 0:
        row["better"] = "a" if sign * diff > 0 else "b"
    if t["paired"] and diff != 0:
        per_seed = np.array([a[s] - b[s] for s in sorted(a)])
        row["seeds_agree"] = int(np.sum(np.sign(per_seed) == np.sign(diff)))
    if items_a is not None and items_b is not None and items_a.shape[1] == items_b.shape[1]:
        row["n_items"] = int(items_a.shape[1])
        row["p_items"] = stats.item_pvalue(items_a, items_b)
        if opts.bootstrap > 0:
            row["ci"] = stats.bootstrap_diff(items_a, items_b, t["paired"], opts.bootstrap, opts.seed)
    if not testable:
        row["note"] = f"not tested: fewer than {opts.min_seeds} seeds per variant"
    return row


def pairwise(
    variants: list[str], scores: dict[str, dict[int, float]], items: dict[str, np.ndarray] | None, sign: int, opts
) -> list[dict]:
    """Every pair (a before b in `variants` order), each a `compare` row with a and b named."""
    rows = []
    for i, a in enumerate(variants):
        for b in variants[i + 1 :]:
            row = compare(scores[a], scores[b], sign, opts, items[a] if items else None, items[b] if items else None)
            row["better"] = {"a": a, "b": b}.get(row["better"])
            rows.append({"a": a, "b": b, **row})
    return rows


def apply_family(series: list[dict], opts, where: str, decisions: list[dict] | None = None) -> dict:
    """Benjamini-Hochberg over every testable pair of the given series (in place: p_bh, significant). Rows of
    these series that cannot be tested are not significant; rows of other series stay None. decisions: the series
    decisions are read on (default: all of them), a subset of `series`."""
    decisions = series if decisions is None else decisions
    rows = [p for s in series for p in s["pairwise"]]
    tested = [p for p in rows if p["testable"]]
    for p, adjusted in zip(tested, stats.bh_adjust([p["p_seeds"] for p in tested])):
        p["p_bh"], p["significant"] = adjusted, bool(adjusted < opts.alpha)
    for p in rows:
        if not p["testable"]:
            p["significant"] = False
    pairs = max((len(s["pairwise"]) for s in series), default=0)
    names = ", ".join(label(s) for s in decisions)
    if len(series) > len(decisions):
        text = (
            f"every variant pair x candidate metric {where}: {pairs} pair(s) x {len(series)} metric(s) "
            f"(validation loss and every task metric but the choices-only baselines; decisions on {names}) = "
            f"{len(rows)} comparisons, {len(tested)} with >= {opts.min_seeds} seeds per variant tested"
        )
    else:
        text = (
            f"every variant pair x decision metric {where}: {pairs} pair(s) x {len(series)} metric(s) "
            f"({names}) = {len(rows)} comparisons, {len(tested)} with >= {opts.min_seeds} seeds per variant tested"
        )
    if not rows:
        text = f"no comparison {where}: fewer than 2 variants or no decision metric"
    return {
        "method": "Benjamini-Hochberg",
        "alpha": opts.alpha,
        "level": "training seed",
        "min_seeds": opts.min_seeds,
        "power": opts.power,
        "family": text,
        "tests": len(tested),
        "comparisons": len(rows),
        "metrics": [[s["task"], s["metric"]] for s in decisions],
        "family_metrics": [[s["task"], s["metric"]] for s in series],
    }


def label(s: dict) -> str:
    """A decision metric's short name: the task without ":cf", plus the metric when it is not the primary."""
    name = s["task"][:-3] if s["task"].endswith(":cf") else s["task"]
    if s["task"] == VAL_TASK:
        return "val_bpb" if s["metric"] == "bpb" else name
    return name if s["primary"] else f"{name} [{s['metric']}]"


def _p(x, op: str = "=") -> str:
    """p_BH=0.003, p_BH<0.001, or with op "<=" a bound over several pairs."""
    return "p_BH n/a" if x is None else "p_BH<0.001" if x < 0.001 else f"p_BH{op}{x:.2g}"


def decide_series(s: dict, opts) -> dict | None:
    """The decision on one metric: leader, the variants it is significantly ahead of, and one sentence."""
    sign = 1 if s["direction"] == "higher" else -1
    variants = list(s["final"])
    if len(variants) < 2:
        return None
    order = sorted(variants, key=lambda v: -sign * s["final"][v]["mean"])  # stable: ties keep natural order
    leader, runner = order[0], order[1]
    vs = {o: next(p for p in s["pairwise"] if {p["a"], p["b"]} == {leader, o}) for o in order[1:]}
    beaten = [o for o in order[1:] if vs[o]["significant"] and vs[o]["better"] == leader]
    level = [o for o in order[1:] if o not in beaten]
    seeds = min(len(s["final"][v]["seeds"]) for v in variants)
    name, close = label(s), vs[runner]
    need = close["seeds_needed"]
    out = {
        "task": s["task"],
        "metric": s["metric"],
        "name": name,
        "direction": s["direction"],
        "leader": leader,
        "ahead_of": beaten,
        "not_separated_from": level,
        "seeds": seeds,
        "seeds_needed": need,
        "p_bh": {o: vs[o]["p_bh"] for o in order[1:]},
        "status": None,
        "text": "",
    }
    if s["best"] is None:
        out["status"], out["text"] = "tie", f"{name}: tie at the top ({leader}, {runner})"
    elif not close["testable"]:
        out["status"] = "too_few_seeds"
        how = f"~{need} seeds needed" if need is not None else "seed spread unknown"
        out["text"] = f"{name}: {leader} ahead, not established with {seeds} seed{'s' * (seeds != 1)} ({how})"
    elif not level:
        worst = max(vs[o]["p_bh"] for o in order[1:])
        out["status"] = "best"
        out["text"] = f"{name}: {leader} best ({_p(worst, '=' if len(order) == 2 else '<=')}, {seeds} seeds)"
    elif not beaten:
        out["status"] = "no_difference"
        how = f"; ~{need} needed" if need is not None and need > seeds else ""
        out["text"] = (
            f"{name}: no significant difference ({leader} vs {runner} {_p(close['p_bh'])}, {seeds} seeds{how})"
        )
    else:
        worst = max(vs[o]["p_bh"] for o in beaten)
        out["status"] = "ahead"
        out["text"] = (
            f"{name}: {', '.join([leader] + level)} ahead of {', '.join(beaten)} ({_p(worst, '<=')}, "
            f"{seeds} seeds); {leader} vs {runner} not significant"
        )
    return out


def winner(decisions: list[dict]) -> str | None:
    """The variant significantly best on some decision metric and significantly behind on none; None when no
    variant is, or when two are best on different metrics."""
    tops = {d["leader"] for d in decisions if d["status"] == "best"}
    behind = {v for d in decisions if d["status"] in ("best", "ahead") for v in d["ahead_of"]}
    candidates = tops - behind
    return next(iter(candidates)) if len(candidates) == 1 and len(tops) == 1 else None


def decision_series(group: dict, recommendation: dict) -> list[dict]:
    """Validation loss, then each suite task's recommended metric: the only series decisions rest on."""
    keys = [(VAL_TASK, "loss"), (VAL_TASK, "bpb")]  # the val task holds one: bpb when tokenizers differ
    keys += [(e["task"], e["metric"]) for e in recommendation["suite"] if e["task"] != VAL_TASK]
    by_key = {(s["task"], s["metric"]): s for s in group["series"]}
    return [by_key[k] for k in keys if k in by_key]


def family_series(group: dict, decisions: list[dict]) -> list[dict]:
    """The decision series, then every other candidate metric of the group (not the choices-only baselines): the
    Benjamini-Hochberg family, so that choosing among them cannot add a claim."""
    return decisions + [s for s in group["series"] if not s["baseline"] and not any(s is d for d in decisions)]


def headline(experiment: str, group: dict, recommendation: dict, overview: dict, opts) -> dict:
    """One short sentence per decision metric, the tasks without signal named once, and the overall winner."""
    variants = group["variants"]
    excluded = overview["not_analyzed"]
    tail = f" ({len(excluded)} run(s) unfinished or failed, left out: {', '.join(excluded)})" if excluded else ""
    if overview.get("diverged"):
        tail += f" ({len(overview['diverged'])} diverged, listed apart: {', '.join(overview['diverged'])})"
    short = {t["task"]: label({"task": t["task"], "metric": "", "primary": True}) for t in recommendation["rejected"]}
    no_signal = [
        short[r["task"]] for r in recommendation["rejected"] if r["status"] == "no_signal" and r["task"] != VAL_TASK
    ]
    unknown = [
        short[r["task"]] for r in recommendation["rejected"] if r["status"] != "no_signal" and r["task"] != VAL_TASK
    ]
    left_out = sorted({m["task"] for m in group.get("item_mismatch", []) if not m["kept"]})
    out = {"winner": None, "decisions": [], "no_signal": no_signal, "not_assessable": unknown, "left_out": left_out}
    if len(variants) < 2:
        out["winner"] = variants[0] if variants else None
        out["text"] = f"{experiment}: {len(variants)} variant(s) finished, nothing to compare{tail}"
        return out
    decisions = [d for s in decision_series(group, recommendation) if (d := decide_series(s, opts))]
    out["decisions"] = decisions
    parts = [d["text"] for d in decisions]
    if no_signal:
        parts.append(f"{', '.join(no_signal)}: no signal here")
    if unknown:
        parts.append(f"{', '.join(unknown)}: signal not assessable with these runs")
    if left_out:
        parts.append(f"{', '.join(left_out)}: left out (runs scored different items)")
    out["winner"] = winner(decisions)
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
            f" (seeds needed: per variant, for {opts.power:.0%} power at alpha {opts.alpha:g}, from the "
            f"observed seed spread)"
        )
    averaged = (
        f" Each run's score: the mean of its last {opts.average_last} evaluations." if opts.average_last > 1 else ""
    )
    out["text"] = f"{experiment}: " + "; ".join(parts) + f"{scope}. {verdict}.{tail}{averaged}"
    return out
