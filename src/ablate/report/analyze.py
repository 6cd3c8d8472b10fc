"""Run folders -> every figure of the report, as one JSON-ready dict (report.json). Rendering reads only that dict.

Per scale group (one group without a scale axis), per task and metric ("series"): final scores with CIs, pairwise
tests, curves, and the early-signal criteria; then a recommendation and a headline from the largest scale.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ablate.report import stats
from ablate.report.load import (BASELINE_METRICS, PRIOR_CONTROLLED, VAL_TASK, Run, TaskInfo, direction,
                                group_by_scale, load_runs, task_infos)


@dataclass
class Options:
    alpha: float = 0.05  # significance level of pairwise tests
    min_monotonicity: float = 0.5  # mean Spearman rho of score vs step (FineTasks' threshold)
    min_tau: float = 0.6  # mean Kendall tau vs the final ranking over the second half of training
    min_z: float = 2.0  # "above chance": final score this many standard errors past chance
    min_snr: float | None = None  # optional SNR threshold (FineTasks used 20); None: not a criterion
    last_k: int = 3  # checkpoints at the end of a run whose spread is its noise
    early_fraction: float = 0.25  # "early" checkpoint for decision accuracy: first at >= this share of training
    bootstrap: int = 2000  # bootstrap replicates for confidence intervals
    seed: int = 0  # bootstrap RNG seed: the same runs give the same report
    scale: list[str] = field(default_factory=list)  # config fields forming a scale axis, e.g. ["model.d_model"]


def _series_points(run: Run, key) -> list:
    return run.scores.get(key) or []


def _common_steps(runs: list[Run], key) -> list[int]:
    steps = None
    for run in runs:
        mine = {p.step for p in _series_points(run, key)}
        steps = mine if steps is None else steps & mine
    return sorted(steps or [])


def _value_at(run: Run, key, step: int):
    return next(p for p in _series_points(run, key) if p.step == step)


def _item_values(run: Run, task: TaskInfo, metric: str) -> dict[str, float] | None:
    """{item id: value} of the run's last evaluation of the task, or None without per-item files."""
    points = _series_points(run, (task.key, metric))
    rows = run.items(task, points[-1].step) if points else None
    if not rows or any(metric not in row for row in rows.values()):
        return None
    return {i: float(row[metric]) for i, row in rows.items()}


def _matrix(values_by_seed: dict[int, dict[str, float]], seeds: list[int], ids: list[str]) -> np.ndarray:
    return np.array([[values_by_seed[s][i] for i in ids] for s in seeds])


def _common_ids(maps) -> list[str]:
    ids = None
    for m in maps:
        ids = set(m) if ids is None else ids & set(m)
    return sorted(ids or [])


def _curve(runs: list[Run], key) -> dict:
    steps = _common_steps(runs, key)
    values = np.array([[_value_at(r, key, s).value for s in steps] for r in runs]) if steps else np.zeros((0, 0))
    return {"steps": steps, "tokens": [_value_at(runs[0], key, s).tokens for s in steps],
            "mean": values.mean(axis=0).tolist() if steps else [],
            "std": values.std(axis=0, ddof=1).tolist() if len(runs) >= 2 and steps else None,
            "min": values.min(axis=0).tolist() if steps else [], "max": values.max(axis=0).tolist() if steps else []}


def _train_curve(runs: list[Run]) -> dict:
    by_step = [{p.step: p for p in r.train_loss} for r in runs]
    steps = sorted(set.intersection(*(set(b) for b in by_step))) if by_step else []
    values = np.array([[b[s].value for s in steps] for b in by_step]) if steps else np.zeros((0, 0))
    return {"steps": steps, "tokens": [by_step[0][s].tokens for s in steps],
            "mean": values.mean(axis=0).tolist() if steps else [],
            "std": values.std(axis=0, ddof=1).tolist() if len(runs) >= 2 and steps else None,
            "min": values.min(axis=0).tolist() if steps else [], "max": values.max(axis=0).tolist() if steps else []}


def _final_scores(runs_by_variant, task, metric, opts) -> tuple[dict, dict]:
    key = (task.key, metric)
    final, items = {}, {}
    for variant, runs in runs_by_variant.items():
        finals = [_series_points(r, key)[-1].value for r in runs]
        per_seed = {r.seed: _item_values(r, task, metric) for r in runs}
        ci, n_items = None, None
        if all(v is not None for v in per_seed.values()):
            items[variant] = per_seed
            seeds, ids = sorted(per_seed), _common_ids(per_seed.values())
            n_items = len(ids)
            if ids:
                ci = stats.bootstrap_mean(_matrix(per_seed, seeds, ids), opts.bootstrap, opts.seed)
        final[variant] = {"mean": float(np.mean(finals)), "seed_std": stats.std(finals), "values": finals,
                          "seeds": [r.seed for r in runs], "steps": [_series_points(r, key)[-1].step for r in runs],
                          "ci": ci, "n_items": n_items}
    return final, items


def _pairwise(variants: list[str], items: dict, final: dict, sign: int, opts) -> list[dict]:
    rows = []
    for i, a in enumerate(variants):
        for b in variants[i + 1:]:
            diff = final[a]["mean"] - final[b]["mean"]
            row = {"a": a, "b": b, "diff": diff, "better": a if sign * diff > 0 else b if sign * diff < 0 else None,
                   "ci": None, "p_items": None, "p_seeds": None, "seeds_agree": None, "n_seeds": None,
                   "n_items": None, "significant": None, "note": ""}
            seeds = sorted(set(items.get(a, {})) & set(items.get(b, {})))
            ids = _common_ids([items[a][s] for s in seeds] + [items[b][s] for s in seeds]) if seeds else []
            if not seeds:
                row["note"] = "no per-item files" if a not in items or b not in items else "no seeds in common"
            elif len(ids) < 2:
                row["note"] = "fewer than 2 items in common"
            else:
                result = stats.paired_comparison(_matrix(items[a], seeds, ids), _matrix(items[b], seeds, ids),
                                                 opts.bootstrap, opts.seed)
                row.update(result)  # diff: now over the seeds and items both variants share
                row["better"] = a if sign * row["diff"] > 0 else b if sign * row["diff"] < 0 else None
                ci_excludes_zero = result["ci"] is not None and (result["ci"][0] > 0 or result["ci"][1] < 0)
                row["significant"] = bool(result["p_items"] is not None and result["p_items"] < opts.alpha
                                          and ci_excludes_zero)
            rows.append(row)
    return rows


def _chance_figures(runs: list[Run], task: TaskInfo, metric: str, sign: int, opts) -> dict:
    """Distance from chance pooled over all runs: mean score vs the mean standard error (seeds score the same
    items, so their errors are not independent: averaging them, not dividing by sqrt(runs), stays conservative)."""
    key, chance = (task.key, metric), task.chance_for(metric)
    out = {"chance": chance, "z_final": None, "first_significant_step": None, "first_significant_tokens": None,
           "by_checkpoint": [], "gain_over_choices_only": None, "gain_z": None}
    if chance is None:
        return out

    def pooled(points):
        se = [p.stderr for p in points]
        mean = float(np.mean([p.value for p in points]))
        return mean, (float(np.mean(se)) if all(s is not None for s in se) else None)

    mean, se = pooled([_series_points(r, key)[-1] for r in runs])
    out["z_final"] = stats.chance_z(mean, se, chance, sign)
    for step in _common_steps(runs, key):
        points = [_value_at(r, key, step) for r in runs]
        m, s = pooled(points)
        z = stats.chance_z(m, s, chance, sign)
        out["by_checkpoint"].append({"step": step, "tokens": points[0].tokens, "mean": m, "z": z})
        if out["first_significant_step"] is None and z is not None and z >= opts.min_z:
            out["first_significant_step"], out["first_significant_tokens"] = step, points[0].tokens
    baseline_key = (task.key, "acc_choices_only")
    if metric.startswith("acc_") and metric not in BASELINE_METRICS and all(r.scores.get(baseline_key) for r in runs):
        # Unpaired standard error of the gain: conservative, since a metric and its baseline share items.
        gains, ses = [], []
        for run in runs:
            point = _series_points(run, key)[-1]
            base = next((p for p in run.scores[baseline_key] if p.step == point.step), None)
            if base is None:
                return out
            gains.append(point.value - base.value)
            ses.append(math.hypot(point.stderr, base.stderr) if point.stderr is not None and base.stderr is not None
                       else None)
        out["gain_over_choices_only"] = float(np.mean(gains))
        if all(s is not None for s in ses):
            out["gain_z"] = stats.chance_z(out["gain_over_choices_only"], float(np.mean(ses)), 0.0, 1)
    return out


def _ranking_figures(runs_by_variant: dict, final: dict, key, sign: int, opts) -> dict:
    """Kendall tau and decision accuracy of the ranking at each shared checkpoint against the final ranking."""
    variants = list(final)
    out = {"by_checkpoint": [], "tau_second_half": None, "consistent_from_step": None,
           "consistent_from_fraction": None, "early_step": None, "early_decision_accuracy": None}
    all_runs = [r for v in variants for r in runs_by_variant[v]]
    steps = _common_steps(all_runs, key)
    if len(variants) < 2 or len(steps) < 2:
        return out
    target = [sign * final[v]["mean"] for v in variants]
    last = steps[-1]
    for step in steps:
        now = [sign * float(np.mean([_value_at(r, key, step).value for r in runs_by_variant[v]])) for v in variants]
        out["by_checkpoint"].append({"step": step, "tokens": _value_at(all_runs[0], key, step).tokens,
                                     "tau": stats.kendall(now, target),
                                     "decision_accuracy": stats.decision_accuracy(now, target)})
    rows = out["by_checkpoint"]
    out["tau_second_half"] = stats.mean_or_none([r["tau"] for r in rows if last / 2 <= r["step"] < last])
    for row in reversed(rows[:-1]):  # earliest checkpoint from which every later tau clears the threshold
        if row["tau"] is None or row["tau"] < opts.min_tau:
            break
        out["consistent_from_step"], out["consistent_from_fraction"] = row["step"], row["step"] / last
    early = next((r for r in rows if opts.early_fraction * last <= r["step"] < last), None)
    if early is not None:
        out["early_step"], out["early_decision_accuracy"] = early["step"], early["decision_accuracy"]
    return out


def _quality(runs_by_variant: dict, final: dict, task: TaskInfo, metric: str, sign: int, opts) -> dict:
    key = (task.key, metric)
    runs = [r for rs in runs_by_variant.values() for r in rs]
    rho = {r.label: stats.spearman([p.step for p in _series_points(r, key)],
                                   [sign * p.value for p in _series_points(r, key)]) for r in runs}
    tails = {r.label: [p.value for p in _series_points(r, key)[-opts.last_k:]] for r in runs}
    signal = stats.relative_dispersion([f["mean"] for f in final.values()])
    noise = stats.mean_or_none([stats.relative_std(t) for t in tails.values()])
    q = {"monotonicity": stats.mean_or_none(rho.values()), "monotonicity_per_run": rho,
         "seed_spread": stats.mean_or_none([f["seed_std"] for f in final.values()]),
         "checkpoint_spread": stats.mean_or_none([stats.std(t) for t in tails.values()]),
         "signal": signal, "noise": noise,
         "snr": signal / noise if signal is not None and noise else None,
         "chance": _chance_figures(runs, task, metric, sign, opts),
         "ranking": _ranking_figures(runs_by_variant, final, key, sign, opts)}
    c = q["chance"]
    above = None
    if c["z_final"] is not None:
        past_prior = c["gain_z"] is None or c["gain_z"] >= opts.min_z or metric in PRIOR_CONTROLLED
        above = c["z_final"] >= opts.min_z and past_prior
    criteria = {"monotone": None if q["monotonicity"] is None else q["monotonicity"] >= opts.min_monotonicity,
                "above_chance": above,
                "consistent": None if q["ranking"]["tau_second_half"] is None
                else q["ranking"]["tau_second_half"] >= opts.min_tau}
    if opts.min_snr is not None:
        criteria["snr"] = None if q["snr"] is None else q["snr"] >= opts.min_snr
    # Every criterion must be shown; a metric without a chance level cannot show task-specific signal.
    q["criteria"] = criteria
    q["passes"] = (metric not in BASELINE_METRICS and all(criteria[k] is True for k in ("monotone", "consistent",
                                                                                      "above_chance"))
                   and criteria.get("snr") is not False)
    return q


def _best(final: dict, sign: int) -> str | None:
    """The variant with the best mean final score; None when several share it (a tie names no winner)."""
    top = max(sign * f["mean"] for f in final.values())
    leaders = [v for v, f in final.items() if sign * f["mean"] == top]
    return leaders[0] if len(leaders) == 1 else None


def analyze_series(runs_by_variant: dict, task: TaskInfo, metric: str, opts: Options) -> dict | None:
    key = (task.key, metric)
    with_scores = {v: [r for r in rs if _series_points(r, key)] for v, rs in runs_by_variant.items()}
    with_scores = {v: rs for v, rs in with_scores.items() if rs}
    if not with_scores:
        return None
    sign = direction(metric)
    final, items = _final_scores(with_scores, task, metric, opts)
    variants = list(final)
    return {"task": task.key, "metric": metric, "primary": metric == task.primary,
            "direction": "higher" if sign > 0 else "lower", "chance": task.chance_for(metric),
            "baseline": metric in BASELINE_METRICS, "has_items": len(items) == len(variants),
            "runs": {r.label: {"variant": v, "seed": r.seed, "steps": [p.step for p in _series_points(r, key)],
                               "tokens": [p.tokens for p in _series_points(r, key)],
                               "values": [p.value for p in _series_points(r, key)],
                               "stderr": [p.stderr for p in _series_points(r, key)]}
                     for v, rs in with_scores.items() for r in rs},
            "final": final, "best": _best(final, sign),
            "pairwise": _pairwise(variants, items, final, sign, opts),
            "curve": {v: _curve(rs, key) for v, rs in with_scores.items()},
            "quality": _quality(with_scores, final, task, metric, sign, opts)}


def analyze_group(scale, runs_by_variant: dict[str, list[Run]], tasks: dict[str, TaskInfo], opts: Options) -> dict:
    finished = {v: [r for r in rs if r.status == "finished"] for v, rs in sorted(runs_by_variant.items())}
    finished = {v: rs for v, rs in finished.items() if rs}
    series = [s for task in tasks.values() for metric in task.metrics
              if (s := analyze_series(finished, task, metric, opts)) is not None]
    return {"scale": scale, "variants": list(finished),
            "seeds": {v: [r.seed for r in rs] for v, rs in finished.items()},
            "train_loss": {v: _train_curve(rs) for v, rs in finished.items()}, "series": series}


def _across_scales(groups: list[dict]) -> list[dict]:
    """Decision accuracy and Kendall tau of each smaller scale's final ranking against the largest scale's."""
    if len(groups) < 2:
        return []
    out = []
    for target in groups[-1]["series"]:
        sign = 1 if target["direction"] == "higher" else -1
        rows = []
        for group in groups[:-1]:
            small = next((s for s in group["series"] if (s["task"], s["metric"]) == (target["task"], target["metric"])),
                         None)
            shared = [v for v in target["final"] if small and v in small["final"]]
            if small is None or len(shared) < 2:
                continue
            now = [sign * small["final"][v]["mean"] for v in shared]
            goal = [sign * target["final"][v]["mean"] for v in shared]
            rows.append({"scale": group["scale"], "variants": shared,
                         "decision_accuracy": stats.decision_accuracy(now, goal), "tau": stats.kendall(now, goal)})
        if rows:
            out.append({"task": target["task"], "metric": target["metric"], "by_scale": rows})
    return out


def _recommendation(group: dict, tasks: dict[str, TaskInfo], opts: Options) -> dict:
    suite, rejected = [], []
    for task in tasks.values():
        mine = [s for s in group["series"] if s["task"] == task.key]
        passing = [s for s in mine if s["quality"]["passes"]]
        if passing:
            best = next((s for s in passing if s["primary"]), None) or max(
                passing, key=lambda s: (s["quality"]["snr"] or -math.inf, s["quality"]["monotonicity"]))
            suite.append({"task": task.key, "metric": best["metric"], "direction": best["direction"],
                          "passing_metrics": [s["metric"] for s in passing]})
        elif mine:
            primary = next((s for s in mine if s["primary"]), mine[0])
            failed = [name for name, ok in primary["quality"]["criteria"].items() if ok is False]
            unknown = [name for name, ok in primary["quality"]["criteria"].items() if ok is None]
            rejected.append({"task": task.key, "metric": primary["metric"], "failed": failed,
                             "not_computable": unknown})
    aggregate = {}
    variants = group["variants"]
    if suite and len(variants) >= 2:
        zs, ranks = {v: [] for v in variants}, {v: [] for v in variants}
        for entry in suite:
            s = next(x for x in group["series"] if (x["task"], x["metric"]) == (entry["task"], entry["metric"]))
            sign = 1 if s["direction"] == "higher" else -1
            names = [v for v in variants if v in s["final"]]
            m = np.array([sign * s["final"][v]["mean"] for v in names])
            z = (m - m.mean()) / m.std() if m.std() > 0 else np.zeros_like(m)
            order = (-m).argsort().argsort() + 1  # rank 1 = best
            for v, zv, rv in zip(names, z, order):
                zs[v].append(float(zv))
                ranks[v].append(int(rv))
        aggregate = {v: {"mean_z": stats.mean_or_none(zs[v]), "mean_rank": stats.mean_or_none(ranks[v]),
                         "tasks": len(zs[v])} for v in variants}
    return {"thresholds": {"min_monotonicity": opts.min_monotonicity, "min_z": opts.min_z, "min_tau": opts.min_tau,
                           "min_snr": opts.min_snr}, "suite": suite, "rejected": rejected, "aggregate": aggregate}


def _headline(experiment: str, group: dict, recommendation: dict, overview: dict, opts: Options) -> dict:
    primaries = [s for s in group["series"] if s["primary"]]
    variants = group["variants"]
    only_val = all(s["task"] == VAL_TASK for s in primaries)
    excluded = overview["not_analyzed"]
    tail = f" ({len(excluded)} run(s) unfinished or failed, left out: {', '.join(excluded)})" if excluded else ""
    if overview.get("diverged"):
        tail += f" ({len(overview['diverged'])} diverged, listed apart: {', '.join(overview['diverged'])})"
    if len(variants) < 2:
        return {"winner": variants[0] if variants else None, "comparisons": [],
                "text": f"{experiment}: {len(variants)} variant(s) finished, nothing to compare{tail}"}
    wins = {v: sum(s["best"] == v for s in primaries) for v in variants}
    ranks = {v: [] for v in variants}
    for s in primaries:
        sign = 1 if s["direction"] == "higher" else -1
        for rank, v in enumerate(sorted(s["final"], key=lambda x: -sign * s["final"][x]["mean"])):
            ranks[v].append(rank)
    winner = max(variants, key=lambda v: (wins[v], -(stats.mean_or_none(ranks[v]) or 0)))
    comparisons, parts = [], []
    for other in variants:
        if other == winner:
            continue
        rows = [p for s in primaries for p in s["pairwise"] if {p["a"], p["b"]} == {winner, other}]
        won = sum(p["better"] == winner for p in rows)
        significant = sum(p["better"] == winner and bool(p["significant"]) for p in rows)
        lost_significant = sum(p["better"] == other and bool(p["significant"]) for p in rows)
        comparisons.append({"winner": winner, "other": other, "tasks": len(rows), "won": won,
                            "significant": significant, "lost_significant": lost_significant})
        text = f"{winner} beats {other} on {won}/{len(rows)} tasks, significantly (p < {opts.alpha:g}) on {significant}"
        parts.append(text + (f" (loses significantly on {lost_significant})" if lost_significant else ""))
    suite = recommendation["suite"]
    suite_text = ("early-signal suite: " + ", ".join(f"{e['task']} [{e['metric']}]" for e in suite)) if suite \
        else "no task passed the early-signal thresholds"
    scope = " (validation loss only: no task evals in these runs)" if only_val else ""
    return {"winner": winner, "comparisons": comparisons,
            "text": f"{experiment}: " + "; ".join(parts) + f"{scope}. {suite_text[0].upper()}{suite_text[1:]}.{tail}"}


def _overview(runs: list[Run], skipped: list[str]) -> dict:
    rows = []
    for r in runs:
        s = r.summary or {}
        rows.append({"run": r.label, "variant": r.variant, "seed": r.seed, "status": r.status, "note": r.note,
                     "steps": r.last_step, "max_steps": r.config.get("train", {}).get("max_steps"),
                     "tokens": s.get("tokens", r.train_loss[-1].tokens if r.train_loss else None),
                     "params": s.get("params"), "wall_seconds": s.get("wall_seconds"),
                     "final_val_loss": s.get("final_val_loss")})
    return {"variants": sorted({r.variant for r in runs}), "seeds": sorted({r.seed for r in runs}), "runs": rows,
            "not_analyzed": [r.label for r in runs if r.status not in ("finished", "diverged")],
            "diverged": [r.label for r in runs if r.status == "diverged"], "skipped_folders": skipped,
            "total_wall_seconds": sum(r["wall_seconds"] or 0 for r in rows)}


def _cannot_compute(group: dict, tasks: dict[str, TaskInfo], has_scale: bool) -> list[str]:
    notes = []
    seeds = {v: len(s) for v, s in group["seeds"].items()}
    if seeds and min(seeds.values()) < 2:
        few = ", ".join(f"{v} has {n}" for v, n in seeds.items() if n < 2)
        notes.append(f"seed spread, seed bands, seed-level p-values and seed resampling in CIs: need >= 2 seeds per "
                     f"variant ({few})")
    checkpoints = [len(r["steps"]) for s in group["series"] for r in s["runs"].values()]
    most = max(checkpoints, default=0)
    if most < 3:
        notes.append(f"monotonicity (Spearman rho): needs >= 3 evaluated checkpoints per run (have {most})")
    if most < 2:
        notes.append("checkpoint spread, SNR noise, Kendall tau and decision accuracy over training: need >= 2 "
                     f"evaluated checkpoints per run (have {most})")
    if len(group["variants"]) < 2:
        notes.append(f"pairwise tests, SNR signal, Kendall tau, decision accuracy and the aggregate score: need >= 2 "
                     f"finished variants (have {len(group['variants'])})")
    missing = sorted({s["task"] for s in group["series"] if not s["has_items"]})
    if missing:
        notes.append("confidence intervals and paired tests: no per-item files (eval_items/) for "
                     + ", ".join(missing))
    if all(t == VAL_TASK for t in tasks):
        notes.append("task scores: the runs have no evals.jsonl (no task evals ran); the report covers validation "
                     "loss only")
    if not has_scale:
        notes.append("decision accuracy across scales: needs a scale axis (ablate report --scale model.d_model)")
    return notes


def build_report(runs_dir: str | Path, opts: Options | None = None) -> dict:
    opts = opts or Options()
    start = time.perf_counter()
    runs, skipped = load_runs(runs_dir)
    tasks = task_infos(runs)
    experiment = runs[0].config.get("experiment") or Path(runs_dir).name
    overview = _overview(runs, skipped)
    groups = [analyze_group(scale, by_variant, tasks, opts) for scale, by_variant in group_by_scale(runs, opts.scale)]
    target = groups[-1]  # the largest scale: what decisions are about
    recommendation = _recommendation(target, tasks, opts)
    return {"schema": 1, "experiment": experiment, "runs_dir": str(runs_dir), "options": dataclasses.asdict(opts),
            "overview": overview,
            "tasks": [{"task": t.key, "primary": t.primary, "metrics": t.metrics, "chance": t.chance, "n": t.n}
                      for t in tasks.values()],
            "groups": groups, "across_scales": _across_scales(groups), "recommendation": recommendation,
            "headline": _headline(experiment + (f" at {','.join(opts.scale)}={target['scale']}" if opts.scale else ""),
                                  target, recommendation, overview, opts),
            "cannot_compute": _cannot_compute(target, tasks, bool(opts.scale)),
            "seconds": time.perf_counter() - start}
