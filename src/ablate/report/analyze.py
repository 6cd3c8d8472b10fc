"""Run folders -> every figure of the report, as one JSON-ready dict (report.json). Rendering reads only that dict.

Per scale group (one group without a scale axis), per task and metric ("series"): final scores with CIs, pairwise
tests, curves, and the signal criteria; then every task x metric's SNR and decision accuracy across scales
(across.py), each task's best measured metric (choose.py), and the decisions and headline at the largest scale
(decide.py). Comparisons are like with like (match.py): equal tokens, identical item sets.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np

from ablate.report.inference import families, pairs
from ablate.report.stats import stats
from ablate.report.inputs import match, tokenizers
from ablate.report.inputs.compute_points import split_budgets
from ablate.report.signal import choose, subjects
from ablate.report.options import Options, floor_value
from ablate.report.signal.across import RESAMPLE, across_scales
from ablate.report.text import headline as words
from ablate.report.sections.multipliers import render as compute_words
from ablate.report.sections.multipliers.section import multipliers_section, recorded_baseline
from ablate.report.sections.sequential import section as study_section
from ablate.report.sections.sweep.section import sweep_section
from ablate.report.inputs.runs import (
    ANSWER_BLIND,
    BASELINE_METRICS,
    PRIOR_CONTROLLED,
    VAL_TASK,
    Point,
    ReportError,
    Run,
    TaskInfo,
    direction,
    direction_name,
    group_by_scale,
    is_accuracy,
    load_runs,
    task_infos,
)
from ablate.text import natural_key


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


def _curve(points: list[list[Point]]) -> dict:
    """Mean, sd, min and max over runs (each run's points, one a step) at the steps every run has."""
    by_step = [{p.step: p for p in run} for run in points]
    steps = sorted(set.intersection(*(set(b) for b in by_step))) if by_step else []
    values = np.array([[b[s].value for s in steps] for b in by_step]) if steps else np.zeros((0, 0))
    return {
        "steps": steps,
        "tokens": [by_step[0][s].tokens for s in steps],
        "mean": values.mean(axis=0).tolist() if steps else [],
        "std": values.std(axis=0, ddof=1).tolist() if len(points) >= 2 and steps else None,
        "min": values.min(axis=0).tolist() if steps else [],
        "max": values.max(axis=0).tolist() if steps else [],
    }


def _final_scores(runs_by_variant: dict, m: match.Matched, opts) -> tuple[dict, dict, dict | None, dict]:
    """Per variant: run-level scores (each run's mean over the compared items at the compared evaluation), their
    mean, seed sd and its interval under the tests' noise model (stats.mean_interval). Also returns the scores,
    (seeds, items) matrices and each run's logged standard error for the tests."""
    final, scores, items, stderrs = {}, {}, ({} if m.ids else None), {}
    for variant, runs in runs_by_variant.items():
        runs = sorted(runs, key=lambda r: r.seed)
        scores[variant] = {r.seed: m.score(r.label) for r in runs}
        stderrs[variant] = {r.seed: m.points[r.label].stderr for r in runs}
        if items is not None:
            items[variant] = np.array([[m.values[r.label][i] for i in m.ids] for r in runs])
        matrix = items[variant] if items is not None else None
        ci = stats.mean_interval(scores[variant], matrix, stderrs[variant], 1 - opts.alpha)
        values = [scores[variant][r.seed] for r in runs]
        final[variant] = {
            "mean": float(np.mean(values)),
            "seed_std": stats.std(values),
            "values": values,
            "seeds": [r.seed for r in runs],
            "steps": [m.points[r.label].step for r in runs],
            "tokens": [m.points[r.label].tokens for r in runs],
            "ci": ci,
            "n_items": len(m.ids) if m.ids else None,
            "averaged": [len(m.windows[r.label]) for r in runs],
        }  # evaluations averaged
    return final, scores, items, stderrs


def _chance_figures(runs: list[Run], task: TaskInfo, metric: str, sign: int, opts, finals: dict) -> dict:
    """Distance from chance pooled over all runs: mean score vs the mean standard error (seeds score the same
    items, so their errors are not independent: averaging them, not dividing by sqrt(runs), stays conservative)."""
    key, chance = (task.key, metric), task.chance_for(metric)
    out = {
        "chance": chance,
        "z_final": None,
        "first_significant_step": None,
        "first_significant_tokens": None,
        "by_checkpoint": [],
        "gain_over_choices_only": None,
        "gain_z": None,
    }
    if chance is None:
        return out

    def pooled(points):
        se = [p.stderr for p in points]
        mean = float(np.mean([p.value for p in points]))
        return mean, (float(np.mean(se)) if all(s is not None for s in se) else None)

    mean, se = pooled([finals[r.label] for r in runs])
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
            point = finals[run.label]
            base = next((p for p in run.scores[baseline_key] if p.step == point.step), None)
            if base is None:
                return out
            gains.append(point.value - base.value)
            ses.append(
                math.hypot(point.stderr, base.stderr) if point.stderr is not None and base.stderr is not None else None
            )
        out["gain_over_choices_only"] = float(np.mean(gains))
        if all(s is not None for s in ses):
            out["gain_z"] = stats.chance_z(out["gain_over_choices_only"], float(np.mean(ses)), 0.0, 1)
    return out


def _at_or_before(run: Run, key, x: int, by_tokens: bool):
    before = [p for p in _series_points(run, key) if (p.tokens if by_tokens else p.step) <= x]
    return before[-1] if before else None


def _ranking_figures(runs_by_variant: dict, final: dict, key, sign: int, opts, m: match.Matched) -> dict:
    """Kendall tau and decision accuracy of the ranking at each checkpoint against the final ranking. Checkpoints
    are those of the run that reached the fewest tokens, up to the compared point; every run contributes its
    evaluation at or just before each (equal tokens; equal steps when token counts are unknown)."""
    variants = list(final)
    out = {
        "by_checkpoint": [],
        "tau_second_half": None,
        "consistent_from_step": None,
        "consistent_from_fraction": None,
        "early_step": None,
        "early_decision_accuracy": None,
    }
    all_runs = [r for v in variants for r in runs_by_variant[v]]
    by_tokens = m.tokens is not None
    ref = min(all_runs, key=lambda r: m.points[r.label].tokens if by_tokens else m.points[r.label].step)
    end = m.points[ref.label]
    grid = [p for p in _series_points(ref, key) if p.step <= end.step]
    if len(variants) < 2 or len(grid) < 2:
        return out
    target = [sign * final[v]["mean"] for v in variants]
    x_of = (lambda p: p.tokens) if by_tokens else (lambda p: p.step)
    last = x_of(grid[-1])
    for point in grid:
        x = x_of(point)
        at = {r.label: _at_or_before(r, key, x, by_tokens) for r in all_runs}
        if any(p is None for p in at.values()):
            continue
        now = [sign * float(np.mean([at[r.label].value for r in runs_by_variant[v]])) for v in variants]
        out["by_checkpoint"].append(
            {
                "step": point.step,
                "tokens": point.tokens,
                "x": x,
                "tau": stats.kendall(now, target),
                "decision_accuracy": stats.decision_accuracy(now, target),
            }
        )
    rows = out["by_checkpoint"]
    out["tau_second_half"] = stats.mean_or_none([r["tau"] for r in rows if last / 2 <= r["x"] < last])
    for row in reversed(rows[:-1]):  # earliest checkpoint from which every later tau clears the threshold
        if row["tau"] is None or row["tau"] < opts.min_tau:
            break
        out["consistent_from_step"], out["consistent_from_fraction"] = row["step"], row["x"] / last
    early = next((r for r in rows if opts.early_fraction * last <= r["x"] < last), None)
    if early is not None:
        out["early_step"], out["early_decision_accuracy"] = early["step"], early["decision_accuracy"]
    for row in rows:
        del row["x"]
    return out


def _quality(
    runs_by_variant: dict, final: dict, task: TaskInfo, metric: str, sign: int, opts, m: match.Matched
) -> dict:
    key = (task.key, metric)
    runs = [r for rs in runs_by_variant.values() for r in rs]
    rho = {
        r.label: stats.spearman(
            [p.step for p in _series_points(r, key)], [sign * p.value for p in _series_points(r, key)]
        )
        for r in runs
    }
    # the noise at the comparison point: each run's last last_k checkpoints up to the one compared (not its end)
    tails = {
        r.label: [p.value for p in _series_points(r, key) if p.step <= m.points[r.label].step][-opts.last_k :]
        for r in runs
    }
    q = {
        "monotonicity": stats.mean_or_none(rho.values()),
        "monotonicity_per_run": rho,
        "seed_spread": stats.mean_or_none([f["seed_std"] for f in final.values()]),
        "checkpoint_spread": stats.mean_or_none([stats.std(t) for t in tails.values()]),
        **stats.signal_noise([f["mean"] for f in final.values()], list(tails.values())),
        "chance": _chance_figures(runs, task, metric, sign, opts, m.points),
        "ranking": _ranking_figures(runs_by_variant, final, key, sign, opts, m),
    }
    c = q["chance"]
    criteria = {
        "monotone": None if q["monotonicity"] is None else q["monotonicity"] >= opts.min_monotonicity,
        "consistent": None
        if q["ranking"]["tau_second_half"] is None
        else q["ranking"]["tau_second_half"] >= opts.min_tau,
    }
    if c["chance"] is not None or is_accuracy(metric):
        # a metric with a chance level (every accuracy: one whose task logs none cannot show it is past chance)
        above = None
        if c["z_final"] is not None:
            past_prior = c["gain_z"] is None or c["gain_z"] >= opts.min_z or metric in PRIOR_CONTROLLED
            above = c["z_final"] >= opts.min_z and past_prior
        criteria["above_chance"] = above
    if opts.min_snr is not None:
        criteria["snr"] = None if q["snr"] is None else q["snr"] >= opts.min_snr
    # Every criterion that applies must be shown (None: not computable, never a pass).
    q["criteria"] = criteria
    # baselines and answer-blind figures never decide a task, whatever their criteria
    q["passes"] = metric not in BASELINE_METRICS | ANSWER_BLIND and all(ok is True for ok in criteria.values())
    return q


def analyze_series(
    runs_by_variant: dict, task: TaskInfo, metric: str, opts: Options, matched: match.Matched | None = None
) -> dict | None:
    key = (task.key, metric)
    with_scores = {v: [r for r in rs if _series_points(r, key)] for v, rs in runs_by_variant.items()}
    with_scores = {v: rs for v, rs in with_scores.items() if rs}
    if not with_scores:
        return None
    m = matched or match.match(
        [r for rs in with_scores.values() for r in rs], task, metric, opts.min_shared_items, opts.average_last
    )
    if m.left_out:
        return None
    sign = direction(metric)
    final, scores, items, stderrs = _final_scores(with_scores, m, opts)
    series = {
        "task": task.key,
        "metric": metric,
        "primary": metric == task.primary,
        "direction": direction_name(sign),
        "chance": task.chance_for(metric),
        "baseline": metric in BASELINE_METRICS,
        "diagnostic": metric in ANSWER_BLIND,
        "has_items": items is not None,
        "compared_at": {
            "tokens": m.tokens,
            "at_last": m.at_last,
            "text": match.token_note(m.points, m.tokens, m.at_last),
        },
        "runs": {
            r.label: {
                "variant": v,
                "seed": r.seed,
                "steps": [p.step for p in _series_points(r, key)],
                "tokens": [p.tokens for p in _series_points(r, key)],
                "values": [p.value for p in _series_points(r, key)],
                "stderr": [p.stderr for p in _series_points(r, key)],
            }
            for v, rs in with_scores.items()
            for r in rs
        },
        "final": final,
        "best": None,  # the leader from the paired estimates (decide.best), set below and again after the families
        "pairwise": pairs.pairwise(list(final), scores, items, sign, opts, stderrs, final),
        "curve": {v: _curve([_series_points(r, key) for r in rs]) for v, rs in with_scores.items()},
        "quality": _quality(with_scores, final, task, metric, sign, opts, m),
        RESAMPLE: {"ids": m.ids, "items": items, "stderr": stderrs},  # for across.py; not a figure of the report
    }
    series["best"] = pairs.best(series)
    return series


def analyze_group(scale, runs_by_variant: dict[str, list[Run]], tasks: dict[str, TaskInfo], opts: Options) -> dict:
    finished = {
        v: [r for r in rs if r.status == "finished"]
        for v, rs in sorted(runs_by_variant.items(), key=lambda kv: natural_key(kv[0]))
    }
    finished = {v: rs for v, rs in finished.items() if rs}
    series, mismatches = [], {}
    for task in tasks.values():
        for metric in task.metrics:
            runs = [r for rs in finished.values() for r in rs if _series_points(r, (task.key, metric))]
            if not runs:
                continue
            m = match.match(runs, task, metric, opts.min_shared_items, opts.average_last)
            if m.mismatch and (task.key not in mismatches or metric == task.primary):
                mismatches[task.key] = m.mismatch  # one per task: the items are the task's, not the metric's
            if (s := analyze_series(finished, task, metric, opts, m)) is not None:
                series.append(s)
    runs = [r for rs in finished.values() for r in rs]
    return {
        "scale": scale,
        "failures": families.failed_seeds(runs_by_variant),
        "variants": list(finished),
        "seeds": {v: [r.seed for r in rs] for v, rs in finished.items()},
        "shape_differences": match.shape_differences(runs),
        "item_mismatch": list(mismatches.values()),
        "train_loss": {v: _curve([r.train_loss for r in rs]) for v, rs in finished.items()},
        "series": series,
    }


def _overview(runs: list[Run], skipped: list[str]) -> dict:
    rows = []
    for r in runs:
        s = r.summary or {}
        rows.append(
            {
                "run": r.label,
                "variant": r.variant,
                "seed": r.seed,
                "status": r.status,
                "note": r.note,
                "steps": r.last_step,
                "max_steps": r.planned_steps,
                "tokens": s.get("tokens", r.train_loss[-1].tokens if r.train_loss else None),
                "params": s.get("params"),
                "params_active": s.get("params_active", s.get("params")),  # with experts: those a token uses
                "kv_bytes_per_token": s.get("kv_cache_bytes_per_token"),
                "wall_seconds": s.get("wall_seconds"),
                "final_val_loss": s.get("final_val_loss"),
                **tokenizers.overview_fields(r),
            }
        )
    return {
        "variants": sorted({r.variant for r in runs}, key=natural_key),
        "seeds": sorted({r.seed for r in runs}),
        "axes": _axes(runs),
        "runs": rows,
        "not_analyzed": [r.label for r in runs if r.status not in ("finished", "diverged")],
        "diverged": [r.label for r in runs if r.status == "diverged"],
        "skipped_folders": skipped,
        "total_wall_seconds": sum(r["wall_seconds"] or 0 for r in rows),
    }


def _axes(runs: list[Run]) -> dict | None:
    """Variants laid out on grid axes: from config["axes"] (recorded by grid()), else from names of the form
    "lr=0.001,global_batch=16". None when the variants are not a grid."""
    by_variant = {}
    for run in runs:
        axes = run.config.get("axes")
        if isinstance(axes, dict) and axes:
            by_variant[run.variant] = {k.split(".")[-1]: v for k, v in axes.items()}
        else:
            parts = [p.split("=", 1) for p in run.variant.split(",")]
            if not all(len(p) == 2 and p[0] for p in parts):
                return None
            by_variant[run.variant] = dict(parts)
    fields = list(dict.fromkeys(k for axes in by_variant.values() for k in axes))
    if not fields:
        return None
    return {"fields": fields, "by_variant": {v: by_variant[v] for v in sorted(by_variant, key=natural_key)}}


def _cannot_compute(group: dict, tasks: dict[str, TaskInfo], has_scale: bool, min_seeds: int) -> list[str]:
    notes = []
    seeds = {v: len(s) for v, s in group["seeds"].items()}
    if seeds and min(seeds.values()) < 2:
        few = ", ".join(f"{v} has {n}" for v, n in seeds.items() if n < 2)
        notes.append(
            f"seed spread, seed bands, seed-level p-values, seeds needed and seed resampling in CIs: need "
            f">= 2 seeds per variant ({few})"
        )
    if seeds and min(seeds.values()) < min_seeds:
        few = ", ".join(f"{v} has {n}" for v, n in seeds.items() if n < min_seeds)
        notes.append(
            f"significance of a difference: needs >= {min_seeds} seeds per variant ({few}); the report "
            f"gives the seeds a test would need instead"
        )
    checkpoints = [len(r["steps"]) for s in group["series"] for r in s["runs"].values()]
    most = max(checkpoints, default=0)
    if most < 3:
        notes.append(f"monotonicity (Spearman rho): needs >= 3 evaluated checkpoints per run (have {most})")
    if most < 2:
        notes.append(
            "checkpoint spread, SNR noise, Kendall tau and decision accuracy over training: need >= 2 "
            f"evaluated checkpoints per run (have {most})"
        )
    if len(group["variants"]) < 2:
        notes.append(
            f"pairwise tests, SNR signal, Kendall tau, decision accuracy and the aggregate score: need >= 2 "
            f"finished variants (have {len(group['variants'])})"
        )
    # val bpb across tokenizers has no pairable items by design (report/tokenizers.py says so)
    missing = sorted({s["task"] for s in group["series"] if not s["has_items"] and s["metric"] != tokenizers.BPB})
    if missing:
        notes.append(
            "confidence intervals and item-level p-values (seed-level tests still run, on the logged "
            "scores): no per-item files (eval_items/) for " + ", ".join(missing)
        )
    if all(t == VAL_TASK for t in tasks):
        notes.append(
            "task scores: the runs have no evals.jsonl (no task evals ran); the report covers validation loss only"
        )
    if not has_scale:
        notes.append("decision accuracy across scales: needs a scale axis (ablate report --scale model.d_model)")
    return notes


def build_report(runs_dir: str | Path, opts: Options | None = None) -> dict:
    opts = opts or Options()
    start = time.perf_counter()
    runs, skipped = load_runs(runs_dir)
    experiment = runs[0].config.get("experiment") or Path(runs_dir).name
    try:
        study = study_section.read_study(runs_dir)  # an adaptive study (ablate run --until-decided): its rule, rounds
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    report = analyze_runs(runs, task_infos(runs), opts, experiment, str(runs_dir), skipped, study)
    report["seconds"] = time.perf_counter() - start
    return report


def analyze_runs(
    runs: list[Run],
    tasks: dict[str, TaskInfo],
    opts: Options,
    experiment: str,
    runs_dir: str = "",
    skipped: list[str] | None = None,
    study: dict | None = None,
) -> dict:
    """Every figure of the report from loaded runs (build_report reads them from disk; the calibration tests build
    them in memory and run this same path). study: the adaptive study's record (study.json), whose contrasts are
    recomputed from the runs into report["sequential"]."""
    overview = _overview(runs, skipped or [])
    tokenizer_note, tasks = tokenizers.apply(runs, tasks)  # runs of several tokenizers: validation in bits per byte
    # an arm at several budgets: the comparisons see it once, at the budget every arm shares; the other budgets are
    # compute points, read by the multipliers alone (inputs/compute_points.py)
    split = split_budgets(runs, opts.scale)
    overview["compute_points"] = [r.label for r in split.extra]
    scales = group_by_scale(split.main, opts.scale)
    label_of = {r.variant: label for _, by_variant in scales for label, rs in by_variant.items() for r in rs}
    try:  # a report built in code gets the command line's check
        floor = floor_value(opts.multiplier_floor)
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    baseline_from = "--baseline"
    if opts.baseline is None and (recorded := recorded_baseline(runs)) is not None:
        opts, baseline_from = dataclasses.replace(opts, baseline=recorded), "the experiment file's multiplier_baseline"
    compute = multipliers_section(split, split.main, label_of, opts, floor, tasks.get(VAL_TASK), baseline_from)
    subject_floor = subjects.apply_floor(scales, tasks, opts)  # before any figure: it changes the groups' average
    groups = [analyze_group(scale, by_variant, tasks, opts) for scale, by_variant in scales]
    target = groups[-1]  # the largest scale: what decisions are about
    if opts.primary and not any(families.is_primary(s, opts) for s in target["series"]):
        have = sorted({f"{s['task']}/{s['metric']}" for s in target["series"]})
        raise ReportError(
            f"--primary {opts.primary}: no such task or task/metric in these runs; they have: {', '.join(have)}"
        )
    across = across_scales(groups, opts)
    for s in (s for g in groups for s in g["series"]):
        del s[RESAMPLE]
    recommendation = choose.recommendation(target, tasks, across, opts)
    where = f"at {','.join(opts.scale)}={target['scale']}" if opts.scale else ""
    decisions = families.decision_series(target, recommendation, opts)
    family = families.family_series(target, decisions)
    inference, tested = families.apply_family(family, opts, where or "(one scale)", decisions)
    # the tested series take their place; no significant pair may put the leader behind
    as_tested = {id(s): {**t, "best": pairs.best(t)} for s, t in zip(family, tested)}
    target = {**target, "series": [as_tested.get(id(s), s) for s in target["series"]]}
    groups[-1] = target
    decisions = [as_tested[id(s)] for s in decisions]
    name = experiment + (f" {where}" if where else "")
    headline = words.headline(name, target, decisions, recommendation, overview, opts, tokenizer_note["text"])
    adaptive = None
    if study is not None:  # recomputed from the runs, under the report's own like-with-like rule
        adaptive = study_section.study_section(runs, study, opts.max_token_gap)
    if adaptive is not None:  # the sequential decisions lead; the fixed-n tests stay, labelled
        inference["valid_under_optional_stopping"] = False
        inference["optional_stopping_note"] = words.OPTIONAL_STOPPING_NOTE
        headline = words.sequential_headline(headline, adaptive, experiment)
    if compute is not None:  # what each variant is worth in compute: said after the decisions, never deciding one
        headline = compute_words.with_headline(headline, compute, opts.scale)
    return {
        "schema": 4,
        "experiment": experiment,
        "runs_dir": runs_dir,
        "options": dataclasses.asdict(opts),
        "overview": overview,
        "tasks": [
            {
                "task": t.key,
                "primary": t.primary,
                "metrics": t.metrics,
                "chance": t.chance,
                "n": t.n,
                "groups": len(t.groups),
            }
            for t in tasks.values()
        ],
        "groups": groups,
        "across_scales": across,
        "subject_floor": subject_floor,
        "recommendation": recommendation,
        "inference": inference,
        "sweep": sweep_section(split.main, opts),  # grid() runs on their axes; None without a grid
        "multipliers": compute,  # compute multipliers on a ladder; None without compute points or --baseline
        "sequential": adaptive,  # None unless the folder holds an adaptive study (study.json)
        "headline": headline,
        "tokenizers": tokenizer_note,
        "cannot_compute": _cannot_compute(target, tasks, bool(opts.scale), opts.min_seeds),
        "seconds": 0.0,
    }
